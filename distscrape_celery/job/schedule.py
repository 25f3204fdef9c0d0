"""When a job runs again: a schedule (every so long, or a cron expression) and the durations the
spec and the command line write as ``90s``, ``15m``, ``6h``, ``2d`` or ``1w``.

A schedule is kept in the tracker as its text (:attr:`Schedule.text`: ``every <seconds>`` or
``cron <expression>``), so any worker can tell when it is next due."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional, Union

from croniter import croniter
from pydantic import Field, model_validator

from .sections import StrictModel

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
# A job may not run more often than this: a schedule is checked on the workers' heartbeats.
MIN_EVERY = 10.0


def parse_duration(value: Union[str, float, int]) -> float:
    """Seconds, from a number or a text such as ``90``, ``90s``, ``15m``, ``6h``, ``2d``, ``1w``
    or ``1h30m``. Raises ValueError saying what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip().lower()
        parts = list(_DURATION.finditer(text))
        if not text or "".join(m.group(0) for m in parts).replace(" ", "") != text.replace(" ", ""):
            raise ValueError(f"{value!r} is not a duration: write seconds, or a number with "
                             "s, m, h, d or w (e.g. 90s, 15m, 6h, 1h30m)")
        seconds = sum(float(n) * _UNITS[unit or "s"] for n, unit in (m.groups() for m in parts))
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"{value!r} is not a duration: it must be a finite number of seconds >= 0")
    return seconds


@dataclass(frozen=True)
class Schedule:
    """Every ``every`` seconds, or at the times of the cron expression ``cron`` (UTC)."""

    every: Optional[float] = None
    cron: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.every is None) == (self.cron is None):
            raise ValueError("a schedule is either every so long or a cron expression")
        if self.every is not None and self.every < MIN_EVERY:
            raise ValueError(f"a schedule runs at most every {MIN_EVERY:g} seconds, not "
                             f"every {self.every:g}")
        if self.cron is not None and not croniter.is_valid(self.cron):
            raise ValueError(f"{self.cron!r} is not a cron expression (five fields: minute "
                             "hour day-of-month month day-of-week, e.g. '0 */6 * * *')")

    @property
    def text(self) -> str:
        """How the tracker keeps it (:meth:`parse` reads it back)."""
        return f"every {self.every:g}" if self.every is not None else f"cron {self.cron}"

    def __str__(self) -> str:
        return f"every {_shown(self.every)}" if self.every is not None else f"cron '{self.cron}'"

    @classmethod
    def parse(cls, text: str) -> "Schedule":
        kind, _, rest = text.partition(" ")
        if kind == "every":
            return cls(every=float(rest))
        if kind == "cron":
            return cls(cron=rest)
        raise ValueError(f"{text!r} is not a schedule")

    def next_after(self, t: float) -> float:
        """The first time the job is due strictly after ``t`` (Unix seconds): runs missed
        before ``t`` are not made up one by one, the next comes once."""
        if self.every is not None:
            return t + self.every
        start = datetime.fromtimestamp(t, tz=timezone.utc)
        return float(croniter(self.cron, start).get_next(float))


def _shown(seconds: Optional[float]) -> str:
    if seconds is None:
        return ""
    for unit in ("w", "d", "h", "m"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{seconds / _UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


class ScheduleSpec(StrictModel):
    """``[schedule]`` of a job file: ``every = "6h"`` or ``cron = "0 */6 * * *"`` (UTC)."""

    every: Optional[float] = Field(
        None, description="Run the job again this long after each run was due (seconds, or "
        "a duration such as 6h).")
    cron: Optional[str] = Field(None, description="Run the job at the times of this cron "
                                "expression (five fields, UTC).")

    @model_validator(mode="before")
    @classmethod
    def _durations(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("every") is not None:
            data = {**data, "every": parse_duration(data["every"])}
        return data

    @model_validator(mode="after")
    def _one(self) -> "ScheduleSpec":
        self.schedule()  # raises ValueError with the reason
        return self

    def schedule(self) -> Schedule:
        return Schedule(every=self.every, cron=self.cron)
