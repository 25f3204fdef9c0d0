"""Handing an item back to the tracker when its download or its save failed.

Every failure counts an attempt: against ``max_retries`` when the item's download or save raised,
against ``max_lost`` when the process holding it vanished. A full output is not the item's fault:
the item keeps its body and its save is tried again later.
"""

from __future__ import annotations

import errno
import logging
from typing import Optional

from ..context import JobContext
from ...errors import ConfigError, TrackerUnavailable
from ...tracker import Fault, Tracker
from ...tracker.redis.staging import BodyStaging
from ...web.fetch import Download
from .publishing import Publisher, dispatch

log = logging.getLogger(__name__)

# A saver failing with one of these cannot store anything right now; the item is not to blame.
_OUTPUT_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def output_full(exc: BaseException) -> Optional[OSError]:
    """The disk-full error behind ``exc`` (itself or a cause), if there is one."""
    seen: set[int] = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in _OUTPUT_FULL:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def left_for_recovery(job: str, item: str, exc: TrackerUnavailable) -> str:
    """The tracker is down: the item stays in flight there, and once its deadline passes it is
    reclaimed. One line, not a traceback per task, while Redis is down."""
    log.warning("%s %s: left for recovery, the tracker is unavailable: %s", job, item, exc)
    return "tracker-unavailable"


class Failures:
    """Hands failed items back to ``tracker`` under their lease, publishing what that hands out
    for scraping, and a deferred save ``save_retry_delay`` seconds later."""

    def __init__(
        self, tracker: Tracker, staging: BodyStaging, publisher: Publisher, save_retry_delay: float
    ) -> None:
        self.tracker = tracker
        self.staging = staging
        self.publisher = publisher
        self.save_retry_delay = save_retry_delay

    def fail(
        self, context: JobContext, item: str, token: int, reason: str, *, fault: Fault,
        retryable: bool = True, delay: float = 0.0,
    ) -> str:
        """Hand ``item`` (leased under ``token``) back for ``reason``: retried after ``delay``
        if ``retryable`` and attempts are left, else dead. Returns the tracker's outcome."""
        spec = context.spec
        reply = self.tracker.fail(
            context.job, item, token, reason, fault=fault, max_retries=spec.max_retries,
            max_lost=spec.max_lost, retryable=retryable, delay=delay,
        )
        dispatch(self.publisher, context.job, reply.dispatch)
        log.warning("%s %s: %s (%s)", context.job, item, reason, reply.outcome.value)
        return reply.outcome.value

    def save_failed(
        self, context: JobContext, item: str, token: int, download: Download, exc: BaseException,
        *, stale: bool,
    ) -> str:
        """The saver raised ``exc`` for ``item``: retry later, defer, or ignore (stale)."""
        if stale:  # the live holder saves it; a late failure changes nothing
            return "stale"
        job = context.job
        full = output_full(exc)
        if full is not None:
            return self._defer(job, item, token, download, full)
        if isinstance(exc, ConfigError):
            # The worker refuses the job's saver or its output (or cannot build it): every
            # attempt would fail the same way.
            log.error("%s %s: save refused: %s", job, item, exc)
            return self.fail(context, item, token, str(exc), fault=Fault.ITEM, retryable=False)
        log.error("%s %s: save failed", job, item, exc_info=exc)
        return self.fail(context, item, token, f"save failed: {exc}", fault=Fault.ITEM)

    def _defer(self, job: str, item: str, token: int, download: Download, error: OSError) -> str:
        """The output is full: keep the item and its body, and try the save again later."""
        if not self.tracker.defer_save(job, item, token):
            return "stale"
        # Staged afresh, not only kept alive: an inline save had staged nothing.
        self.staging.stage(job, token, download.body)
        delay = self.save_retry_delay
        log.error(
            "%s %s: cannot save, the output is full (%s); the item is kept and its save retried "
            "in %.0f s", job, item, error, delay,
        )
        self.publisher.save(job, item, token, download.meta(), delay=delay)
        return "deferred"
