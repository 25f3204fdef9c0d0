"""Trackers: the central authority on workers, jobs and items.

:mod:`.base` holds the contract, :mod:`.model` the values its calls take and return (the item
states among them), :mod:`.defaults` the defaults of the trackers and of the settings.
"""

from .base import MAX_ADD_BATCH, Tracker
from .model import (
    AddResult,
    Checkout,
    CompleteResult,
    CrawlLimits,
    DomainLimits,
    DomainStats,
    FailOutcome,
    FailResult,
    Fault,
    ControlResult,
    ItemState,
    JobAction,
    JobInfo,
    JobState,
    JobStats,
    LeaseStatus,
    MaintainResult,
    RetryDeadResult,
    SaveBegin,
    SaveStart,
    ScrapedResult,
    Urgent,
    WorkerInfo,
)

# The two trackers are imported on first use: the Redis client and, for InMemoryTracker, its
# fake Redis server with a Lua runtime are the slowest imports of a worker or a command that
# only needs the model or the key names.
_LAZY = {"InMemoryTracker": ".memory", "RedisTracker": ".redis"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "MAX_ADD_BATCH", "AddResult", "Checkout", "CompleteResult", "ControlResult", "CrawlLimits",
    "DomainLimits", "DomainStats", "FailOutcome", "FailResult", "Fault", "InMemoryTracker", "ItemState",
    "JobAction", "JobInfo", "JobState", "JobStats", "LeaseStatus", "MaintainResult",
    "RedisTracker", "RetryDeadResult", "SaveBegin", "SaveStart", "ScrapedResult", "Tracker",
    "Urgent", "WorkerInfo",
]
