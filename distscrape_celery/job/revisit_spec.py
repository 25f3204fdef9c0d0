"""``[revisit]`` of a job: how a job that runs again fetches the pages it knows.

A page is known once saved; a later generation fetches it again once it is due (its interval
after the start of the generation that last fetched it), asking its server whether it changed
(``If-None-Match``, ``If-Modified-Since``) and comparing digests: an unchanged page is not saved
again."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, model_validator

from .schedule import parse_duration
from .sections import StrictModel

# Adaptive intervals: an unchanged page waits this much longer, a changed one this much less.
GROW, SHRINK = 1.5, 0.5


class RevisitSpec(StrictModel):
    """How known pages are fetched again (durations in seconds, or as ``6h``, ``7d``)."""

    interval: float = Field(
        0.0, ge=0, description="How long after the start of the generation that fetched a page "
        "it is due again; 0: in every generation.")
    adaptive: bool = Field(
        False, description="Lengthen the interval of a page found unchanged (x1.5) and shorten "
        "that of a changed one (x0.5), within min_interval and max_interval.")
    min_interval: float = Field(3600.0, ge=0, description="Shortest adaptive interval.")
    max_interval: float = Field(30 * 86400.0, ge=0, description="Longest adaptive interval.")
    drop_gone_after: int = Field(
        3, ge=1, le=1000, description="Generations in a row a page may be gone (404, 410) before "
        "it is forgotten (a link to it later is a new page).")

    @model_validator(mode="before")
    @classmethod
    def _durations(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: parse_duration(v) if k.endswith("interval") and isinstance(v, str) else v
                    for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _bounds(self) -> "RevisitSpec":
        if self.adaptive and self.min_interval > self.max_interval:
            raise ValueError("min_interval is longer than max_interval")
        return self

    def next_interval(self, interval: Optional[int], changed: bool) -> int:
        """The interval (whole seconds) a page gets after a fetch that found it ``changed`` or
        not; ``interval`` is its last one (None: a page fetched for the first time)."""
        if interval is None or not self.adaptive:
            start = self.interval
            if self.adaptive:
                start = min(max(start, self.min_interval), self.max_interval)
            return round(start)
        scaled = interval * (SHRINK if changed else GROW)
        if not changed:
            scaled = max(scaled, self.min_interval)
        return round(min(max(scaled, self.min_interval), self.max_interval))
