"""Trackers: the central authority on workers, jobs and items.

:mod:`.base` holds the contract, :mod:`.model` the values its calls take and return.
"""

from .base import MAX_ADD_BATCH, Tracker
from .model import (
    AddResult,
    Checkout,
    CompleteResult,
    CrawlLimits,
    DomainLimits,
    FailOutcome,
    FailResult,
    Fault,
    ControlResult,
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
    WorkerInfo,
)
from .memory import InMemoryTracker
from .redis import RedisTracker

__all__ = [
    "MAX_ADD_BATCH", "AddResult", "Checkout", "CompleteResult", "CrawlLimits", "DomainLimits",
    "ControlResult", "FailOutcome", "FailResult", "Fault", "JobAction", "JobInfo", "JobState",
    "InMemoryTracker", "JobStats", "LeaseStatus", "MaintainResult", "RedisTracker", "RetryDeadResult", "SaveBegin", "SaveStart",
    "ScrapedResult", "Tracker",
    "WorkerInfo",
]
