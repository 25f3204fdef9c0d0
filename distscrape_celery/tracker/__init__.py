"""Trackers: the central authority on workers, jobs and items (see :mod:`.base` for the contract)."""

from .base import (
    MAX_ADD_BATCH,
    AddResult,
    Checkout,
    CompleteResult,
    FailOutcome,
    FailResult,
    JobStats,
    LeaseStatus,
    MaintainResult,
    Tracker,
    WorkerInfo,
)
from .memory_tracker import InMemoryTracker
from .redis_tracker import RedisTracker

__all__ = [
    "MAX_ADD_BATCH", "AddResult", "Checkout", "CompleteResult", "FailOutcome", "FailResult",
    "InMemoryTracker", "JobStats", "LeaseStatus", "MaintainResult", "RedisTracker", "Tracker",
    "WorkerInfo",
]
