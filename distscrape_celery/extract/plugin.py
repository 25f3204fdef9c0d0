"""Records from a function of the job's own (``[extract] function``): whatever it returns is
checked here, so that a function's mistake costs the page's records, never more."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .page import Page

# A function of the page returning its records (dicts of JSON values).
ExtractFunction = Callable[[Page], Iterable[dict]]


class PluginRecords:
    """The records ``function`` gives for a page: at most ``limit`` of them, each a dict."""

    def __init__(self, function: ExtractFunction, name: str) -> None:
        self.function = function
        self.name = name

    def records(self, page: Page, limit: int) -> list[dict]:
        """The function's records for ``page``; ValueError if one is not a dict."""
        given: Any = self.function(page)
        if given is None:
            return []
        if isinstance(given, dict):
            given = [given]
        records = []
        for record in given:
            if len(records) >= limit:
                break
            if not isinstance(record, dict):
                raise ValueError(f"{self.name} returned a {type(record).__name__}, not a dict")
            records.append(record)
        return records
