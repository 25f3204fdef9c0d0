"""How long a failed download waits before it is tried again (the wait itself is the tracker's)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Optional

from ..job.sections import PolitenessSpec


class Backoff:
    """Exponential backoff with equal jitter, at least the server's Retry-After, at most a cap."""

    def __init__(self, base: float, cap: float, rand: Callable[[], float] = random.random) -> None:
        self.base, self.cap, self.rand = base, cap, rand

    @classmethod
    def from_spec(cls, spec: PolitenessSpec) -> "Backoff":
        return cls(spec.backoff_base, spec.backoff_max)

    def delay(self, failed_attempts: int, retry_after: Optional[float] = None) -> float:
        """Seconds before the retry of an item that failed ``failed_attempts`` times before this
        failure: between half and all of ``base * 2**failed_attempts``, at least ``retry_after``."""
        full = min(self.cap, self.base * 2 ** min(failed_attempts, 64))
        wait = full / 2 + self.rand() * full / 2
        if retry_after is not None and retry_after > 0:
            wait = max(wait, min(float(retry_after), self.cap))
        return wait
