"""The tracker interface: the central authority on workers, jobs and the state of every item.

Every item a job has seen is in exactly one state (:class:`~.model.ItemState`), so none can be
lost; docs/architecture.md ("Nothing is lost") draws the calls below that move an item between
them.

Politeness is the tracker's, shared by every worker: each item belongs to a domain (its http(s)
URL's ``host[:port]``, or for an ID the job's download host, see
:func:`~distscrape_celery.tracker.keys.domain_of`) with its own queue; dispatch takes
turns among domains under their in-flight cap, and a checkout takes the domain's fetch slot
(rate limit) or hands the item back, throttled. :class:`CrawlLimits` holds a job's limits.

Every in-flight item carries a deadline on the tracker's clock. A live worker's heartbeat extends
the deadlines of the items it holds; any worker's maintenance reclaims items whose deadline passed.
A save-pending item waits for its save message for up to ``save_timeout``, so a backlog of save
messages never gets it scraped again.

Each checkout hands out a new fencing token, carried by the save message. Only the current holder
(same token) can fail, defer or advance an item; a late holder changes nothing, except that a save
that succeeded late still completes the item (savers are idempotent). Failures are counted by
whose fault they were: the item's (its download or save raised) against ``max_retries``, a
vanished holder (killed, hung or cut-off worker, lost save message) against the larger ``max_lost``.

The values the calls take and return (results, limits, states) are in :mod:`.model`.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Optional

from .defaults import DISPATCH_FACTOR, LEASE_SECONDS, SAVE_BACKLOG_FACTOR
from .revisits import RevisitUpdate
from .model import (
    AddResult,
    Checkout,
    CompleteResult,
    ControlResult,
    CrawlLimits,
    DomainStats,
    FailResult,
    Fault,
    GenerationResult,
    JobAction,
    JobInfo,
    JobStats,
    MaintainResult,
    RetryDeadResult,
    SaveBegin,
    ScrapedResult,
    WorkerInfo,
)

# The most items one call takes or hands back at once: add_stream adds its items in batches of
# this many, and unclaimed_saves returns at most this many unless told otherwise. The Redis
# tracker's scripts take no more in one call, so no batch can overflow the Lua stack or hold
# Redis up for long.
MAX_ADD_BATCH = 500
# Priorities lie within -PRIORITY_MAX .. PRIORITY_MAX: higher goes first within its domain, and
# items of equal priority go first come, first served (the Lua library's PRIORITY_MAX).
PRIORITY_MAX = 1000


def check_priority(priority: int) -> int:
    """``priority`` if it is an integer within the bounds, else ValueError saying so."""
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > PRIORITY_MAX:
        raise ValueError(
            f"priority {priority!r} is not an integer from {-PRIORITY_MAX} to {PRIORITY_MAX}")
    return priority


def batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    """``items`` in lists of up to ``size``, taken from the iterable as they are needed."""
    source = iter(items)
    return iter(lambda: list(itertools.islice(source, size)), [])


class Tracker(ABC):
    """Central authority for a crawl: hands out worker IDs, leases items, deduplicates new items.

    Every method is atomic. Item methods that free a dispatch slot also return items to publish
    as tasks (``.dispatch``); the caller must publish each of them once, a
    :class:`~.model.Urgent` one ahead of the messages waiting where the broker allows it. The
    broker then holds at most ``dispatch_factor`` x the live workers' concurrency scrape messages
    per job (at least one), and ``save_backlog_factor`` x that concurrency pages of save messages.
    """

    def __init__(
        self, *, lease_seconds: float = LEASE_SECONDS, dispatch_factor: float = DISPATCH_FACTOR,
        save_backlog_factor: int = SAVE_BACKLOG_FACTOR, save_timeout: Optional[float] = None,
        body_ttl: Optional[float] = None,
    ) -> None:
        if not dispatch_factor > 0 or save_backlog_factor < 1:
            raise ValueError("dispatch_factor must be above 0 and save_backlog_factor at least 1")
        self.lease_seconds = float(lease_seconds)
        self.dispatch_factor = float(dispatch_factor)
        self.save_backlog_factor = int(save_backlog_factor)
        # How long a save message may wait in the broker before its item is presumed lost.
        self.save_timeout = float(save_timeout) if save_timeout is not None else 8 * self.lease_seconds
        # How long a body staged by scraped is kept (Settings.body_ttl: past the save timeout and
        # a redelivery); the default outlives a save message that waits its whole save timeout.
        self.body_ttl = float(body_ttl) if body_ttl is not None else 2 * self.save_timeout

    # -- workers ---------------------------------------------------------------------------

    @abstractmethod
    def register_worker(self, host: str, pid: int, concurrency: int) -> str:
        """Give a starting worker its unique ID and count it as alive."""

    @abstractmethod
    def heartbeat(self, worker_id: str) -> None:
        """Record that ``worker_id`` is alive."""

    @abstractmethod
    def deregister_worker(self, worker_id: str) -> None:
        """A worker is stopping cleanly: stop counting it as alive."""

    @abstractmethod
    def workers(self) -> list[WorkerInfo]:
        """Every worker ever registered, alive or not."""

    @abstractmethod
    def prune_workers(self, max_age: float) -> list[str]:
        """Forget the records of workers whose last heartbeat is older than ``max_age``
        seconds (a stopped worker's too); returns their IDs."""

    def heal_active_jobs(self) -> int:
        """Repair the list of active jobs where it can lag its jobs' state (a Redis Cluster or
        sharded jobs; see RedisTracker); how many jobs were listed again. A no-op by default:
        a tracker whose every call keeps the list exact needs none."""
        return 0

    @abstractmethod
    def worker_slots(self) -> int:
        """The live workers' concurrency, all together (0 with no live worker)."""

    def dispatch_bound(self) -> int:
        """Most scrape messages of one job the broker may hold now (0 with no live worker)."""
        slots = self.worker_slots()
        return max(1, math.ceil(slots * self.dispatch_factor)) if slots else 0

    def save_bound(self) -> int:
        """Most pages of save messages of one job the broker may hold now."""
        return self.worker_slots() * self.save_backlog_factor

    # -- jobs ------------------------------------------------------------------------------

    @abstractmethod
    def create_job(self, job: str, spec_json: str, limits: Optional[CrawlLimits] = None) -> bool:
        """Store a job's spec and its ``limits`` (default: :class:`CrawlLimits`). True if
        created; False if it exists with the same spec, seeds aside (the stored spec keeps its
        first seeds, and its limits are kept). Raises
        :class:`~distscrape_celery.errors.JobConflict` naming the fields if it differs otherwise."""

    @abstractmethod
    def load_spec(self, job: str) -> str:
        """The job's spec JSON. Raises :class:`~distscrape_celery.errors.JobNotFound`."""

    @abstractmethod
    def jobs(self) -> list[str]:
        """Names of all seeded jobs."""

    @abstractmethod
    def active_jobs(self) -> list[str]:
        """Names of the jobs workers maintain: every job neither finished nor cancelled."""

    @abstractmethod
    def job_info(self, job: str) -> JobInfo:
        """The job's state and times. Raises :class:`~distscrape_celery.errors.JobNotFound`."""

    @abstractmethod
    def control(self, job: str, action: JobAction) -> ControlResult:
        """Pause, resume or cancel ``job`` (see :class:`JobState`); a resume hands out items to
        publish at once. Raises :class:`~distscrape_celery.errors.JobStateError` for a pause or
        cancel of a finished job."""

    @abstractmethod
    def delete_job(self, job: str) -> int:
        """Remove every key of ``job`` without blocking the tracker (small batches), its name
        last; returns how many keys went. The caller checks that no worker runs it."""

    @abstractmethod
    def set_domain_delay(self, job: str, domain: str, seconds: float) -> None:
        """Make ``domain``'s fetches at least ``seconds`` apart in ``job`` (robots.txt
        Crawl-delay), on top of the job's own interval; 0 removes it."""

    @abstractmethod
    def count_sitemap_urls(self, job: str, domain: str, count: int) -> int:
        """Count ``count`` more entries taken from ``domain``'s sitemaps in ``job``; returns the
        domain's total, these included (``count`` 0: the total so far). Atomic: callers that
        count at once get totals that tell each its own share."""

    # -- items -----------------------------------------------------------------------------

    @abstractmethod
    def add(self, job: str, items: Sequence[str], depth: int = 0, priority: int = 0) -> AddResult:
        """Deduplicate ``items`` against everything the job has seen and queue the new ones at
        ``priority`` (see :data:`PRIORITY_MAX`), which an item keeps for good (retried, requeued).
        Raises :class:`~distscrape_celery.errors.JobNotFound` for a job never created (as does
        every item method)."""

    def add_stream(
        self, job: str, items: Iterable[str], depth: int = 0, priority: int = 0
    ) -> Iterator[tuple[int, AddResult]]:
        """Add ``items`` as they come, never holding more than one round trip's worth: yields
        (items taken, result) per round trip. Each batch is atomic; the stream as a whole is not."""
        for batch in batches(items, MAX_ADD_BATCH):
            yield len(batch), self.add(job, batch, depth, priority)

    @abstractmethod
    def checkout(
        self, job: str, item: str, worker_id: str, *, max_lost: int, address: str = ""
    ) -> Checkout:
        """Lease ``item`` to ``worker_id`` for scraping, for ``lease_seconds``, under a new token.
        Taking over an expired lease counts a vanished holder (dead past ``max_lost``). The
        lease takes a fetch slot of the item's site, whose budget every job crawling it shares
        (throttled if none is open). ``address``: what the worker resolved the item's host to;
        a job whose ``politeness.key`` is "ip" paces the host's domain by it from now on."""

    @abstractmethod
    def scraped(
        self, job: str, item: str, token: int, found: Sequence[str] = (), depth: int = 0,
        body: Optional[bytes] = None, save_as: Optional[str] = None, keep_as: Optional[str] = None,
        cut: int = 0, priorities: Sequence[int] = (), *, carry: bool = False,
    ) -> ScrapedResult:
        """Queue ``found`` (at ``depth``; at ``priorities``, one per found item, or all at 0 when
        empty) and, if ``token`` still holds ``item``, make it save
        pending for up to ``save_timeout``. ``cut``: links of the page left out past the job's
        max_links_per_page, added to its ``links_cut`` count in the same step. With ``body``, and only if ``token`` holds the item,
        the body is staged for the save of lease ``token`` in the same step (for ``body_ttl``
        seconds), where :meth:`begin_save` reads it; a stale holder's body is not staged.

        With ``save_as`` (the caller's worker id; not with ``body``), the caller saves the item
        itself right away: the item turns saving under a lease held by ``save_as``, as
        :meth:`begin_save` would make it, and nothing is staged.

        With ``keep_as`` (the caller's worker id), the caller queues the save task later: the
        item waits for it under ``keep_as``'s lease (kept by its heartbeat's ``saves``) until
        :meth:`handoff`, so it is reclaimed a lease after ``keep_as`` vanishes.

        With ``carry``, the caller goes on with one more item itself, in the slot its fetch
        frees: if ``token`` still holds ``item``, one is handed out to it past the dispatch bound
        (politeness kept), first in ``dispatch`` (as :meth:`complete` does)."""

    @abstractmethod
    def handoff(self, job: str, worker_id: str, saves: Sequence[tuple[str, int]]) -> int:
        """``worker_id`` queued the save tasks of these (item, token) pairs, which it kept
        (``scraped(keep_as=...)``): each now waits for its save task for up to ``save_timeout``.
        Pairs that are no longer ``worker_id``'s are left alone. Returns how many were handed."""

    @abstractmethod
    def unclaimed_saves(self, job: str, age: float, limit: int = MAX_ADD_BATCH) -> list[tuple[str, int]]:
        """Up to ``limit`` (item, token) of items handed to the broker (:meth:`handoff`) at least
        ``age`` seconds ago that no worker has taken over since: their save messages wait in the
        broker, or left it with a worker that died before it could take them over."""

    @abstractmethod
    def expire_saves(self, job: str, saves: Sequence[tuple[str, int]]) -> int:
        """These (item, token) have no save message left (it is in no broker queue): end their
        wait now, so the next :meth:`maintain` reclaims them as lost rather than after
        ``save_timeout``. Items taken over or saved meanwhile are left alone. Returns how many."""

    @abstractmethod
    def begin_save(self, job: str, item: str, token: int, worker_id: str, *, max_lost: int) -> SaveBegin:
        """Start saving ``item`` under a lease. A save of the same token that was already running
        vanished with its process: that counts against ``max_lost``. Reads the body staged for
        ``token`` too, for whoever saves (OK or STALE)."""

    def begin_saves(
        self, job: str, saves: Sequence[tuple[str, int]], worker_id: str, *, max_lost: int
    ) -> list[SaveBegin]:
        """:meth:`begin_save` of each (item, token), in order; in one round trip where the
        tracker can. Each is atomic on its own."""
        return [self.begin_save(job, item, token, worker_id, max_lost=max_lost) for item, token in saves]

    @abstractmethod
    def defer_save(self, job: str, item: str, token: int) -> bool:
        """The saver cannot store anything now (e.g. disk full): keep ``item`` save pending for
        another ``save_timeout``, counting nothing. False if ``token`` is stale."""

    @abstractmethod
    def complete(
        self, job: str, item: str, token: Optional[int] = None,
        revisit: Optional[RevisitUpdate] = None, skipped: str = "", *, carry: bool = False,
    ) -> CompleteResult:
        """Mark ``item`` done after it was saved, whoever holds it now. Idempotent; a done item
        is never leased again, and a dead one stays dead. With ``token``, the body staged for
        the save of lease ``token`` is dropped in the same step, whatever the item's state.
        With ``revisit`` (a job that revisits), the item is known from now on with its record,
        and due again by its interval (or, DROPPED, forgotten); the outcome is counted.
        ``skipped``: why the item is done without a save, one of
        :data:`~.model.SKIP_COUNTERS` (the job's counter of that name counts it), or "". With
        ``carry``, the caller goes on with one more item itself, in the slot it frees: one is
        handed out to it past the dispatch bound (politeness kept), first in ``dispatch``."""

    def complete_many(
        self, job: str, saves: Sequence[tuple[str, int]],
        revisits: Optional[Sequence[Optional[RevisitUpdate]]] = None,
    ) -> list[CompleteResult]:
        """:meth:`complete` of each (item, token), with ``revisits[i]`` if given, in order; in
        one round trip where the tracker can. Each is atomic on its own."""
        return [self.complete(job, item, token, revisits[i] if revisits else None)
                for i, (item, token) in enumerate(saves)]

    @abstractmethod
    def changed(self, job: str, entries: Sequence[tuple[str, float]]) -> AddResult:
        """Known items that changed (item, Unix time) after the job last fetched them, by
        another source than their server (a sitemap's lastmod): each is queued now, in the
        running generation, if it is not live already. ``added`` counts those queued."""

    @abstractmethod
    def start_generation(
        self, job: str, seeds: Sequence[str], *, generation: int, due: Optional[str] = None,
        next_due: Optional[str] = None,
    ) -> GenerationResult:
        """Start ``job``'s generation ``generation`` (its current one + 1) if the job is idle
        (finished or expired): its counts begin again, every seed is queued again, the items
        given up on are tried again and (a job that revisits) its known items that are due are
        queued. Exactly one of racing callers starts it. With ``due`` (the text of the job's
        next due time as read), only if that is still the job's next due time and has come;
        ``next_due`` is recorded as the next one. Raises JobNotFound for a job never created."""

    @abstractmethod
    def fail(
        self, job: str, item: str, token: int, reason: str, *, fault: Fault, max_retries: int,
        max_lost: int, retryable: bool = True, delay: float = 0.0,
    ) -> FailResult:
        """The holder of ``token`` reports a failed attempt: queue ``item`` again (after
        ``delay`` seconds on the tracker's clock, if positive) or make it dead with ``reason``.
        Ignored unless ``token`` is the item's current one."""

    @abstractmethod
    def extend(
        self, job: str, items: Sequence[str], worker_id: str,
        saves: Sequence[tuple[str, int]] = (), running: Optional[Sequence[str]] = None,
    ) -> int:
        """Heartbeat of what ``worker_id`` holds: ``items`` whose messages it has reserved,
        ``running`` items of the tasks it runs now (default: ``items``), whose leases only it
        keeps, and ``saves``, (item, token) of save messages it has reserved, whose items then
        depend on this worker's heartbeat instead of the save timeout."""

    @abstractmethod
    def maintain(self, job: str, *, max_lost: int) -> MaintainResult:
        """Reclaim items whose deadline passed, queue backed-off items whose time came, and top
        up dispatch."""

    @abstractmethod
    def release(
        self, job: str, worker_id: Optional[str] = None, saves: Sequence[tuple[str, int]] = ()
    ) -> int:
        """Put the items ``worker_id`` holds back in the frontier at once, counting nothing (a
        worker stopping), except the saves it had reserved, ``saves`` (item, token): their
        messages go back to the broker, so they wait for them again for ``save_timeout``. A kept
        save not listed is queued again (no message for it is taken to exist), and so is every
        dispatched item (the worker may have taken some for messages it never sent; one whose
        message is out gets a second, which finds it taken). With None, every in-flight item of
        the job: only safe when no worker runs it (a stopped one-machine crawl resuming). Returns
        how many items were queued again."""

    @abstractmethod
    def stats(self, job: str) -> JobStats:
        """Counts of the job's items by state."""

    def dead_items(self, job: str, limit: int = 100) -> dict[str, str]:
        """Up to ``limit`` dead items with the reason each was given up on."""
        out: dict[str, str] = {}
        for item, reason in self.iter_dead(job):
            if len(out) >= limit:
                break
            out[item] = reason
        return out

    @abstractmethod
    def iter_dead(self, job: str) -> Iterator[tuple[str, str]]:
        """Every dead item with its reason, streamed (never the whole set at once). Raises
        :class:`~distscrape_celery.errors.JobNotFound` for a job never created."""

    @abstractmethod
    def retry_dead(self, job: str) -> RetryDeadResult:
        """Queue every dead item again with its fault counters reset, in atomic batches."""

    @abstractmethod
    def domain_stats(self, job: str) -> list[DomainStats]:
        """Every domain of the job with something queued, in flight or dead, in no order.
        Reads the job's dead items whole (streamed): it costs as much as ``iter_dead``."""

    @abstractmethod
    def leased_by_worker(self, job: str) -> dict[str, int]:
        """How many of the job's items each worker holds now (scraping or saving), by worker ID;
        workers holding none are left out."""
