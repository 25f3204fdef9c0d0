"""What the routes work with: this process's settings, the tracker and the crawl manager, made
once when the application is."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Depends, Request

from ..core.manager import CrawlManager
from ..settings import Settings
from ..tracker import Tracker


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    tracker: Tracker
    manager: CrawlManager


def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime


# A route's parameter ``rt: Runtime = runtime`` receives the application's Runtime.
runtime = Depends(_runtime)
