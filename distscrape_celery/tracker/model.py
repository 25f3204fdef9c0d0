"""The tracker's value types: what its calls take and return (see :mod:`.base` for the calls).

Plain data with no I/O: enums of call outcomes, the per-call result records (most carry items to
publish as tasks, ``dispatch``), a job's limits, state and counts, and a worker's record.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from .defaults import DOMAIN_CONCURRENCY
from .keys import NO_DOMAIN
from .revisits import Record


class ItemState(str, enum.Enum):
    """Where an item is in its life. Every item a job has seen is in exactly one of these states,
    so none can be lost; docs/architecture.md ("Nothing is lost") draws the calls that move an
    item from one to another.

    The value is the letter the item scripts keep: a live item's bucket packs it with the item's
    depth as ``depth * 8 + code`` (:attr:`code`). The Lua library (tracker/redis/lua/) cannot
    import this enum: its ``CODE`` and ``LETTER`` tables repeat the letters and codes, and
    tests/unit/test_item_states.py checks them against it. A done item leaves the buckets for the
    seen set, so its letter is only what a script reports for it ('D0')."""

    QUEUED = "q"  # in its domain's queue, waiting to be dispatched
    DELAYED = "w"  # waits out a backoff (the delayed set), then is queued again
    DISPATCHED = "d"  # handed out: a scrape message for it exists
    LEASED = "l"  # a worker scrapes it, under a lease
    SAVE_PENDING = "s"  # scraped: its save message waits, in the broker or with a worker
    SAVING = "S"  # a worker saves it, under a lease
    DEAD = "X"  # given up on, with its reason
    DONE = "D"  # saved: only its fingerprint is kept, in the seen set

    @property
    def code(self) -> int:
        """The number packed with the depth in a live-item bucket (0 .. 6). DONE has none: a
        done item is in no bucket."""
        if self is ItemState.DONE:
            raise ValueError("a done item is in no live-item bucket: it has no code")
        return list(ItemState).index(self)


class LeaseStatus(str, enum.Enum):
    """Result of :meth:`Tracker.checkout`."""

    OK = "ok"  # the caller holds the lease now
    BUSY = "busy"  # another worker holds a live lease, or it waits out a backoff
    THROTTLED = "throttled"  # its domain's fetch slot is not open: it went back to its queue
    HELD = "held"  # the job is paused or cancelled: it went back to its queue
    DONE = "done"  # already done: a redelivered duplicate, nothing to do
    DEAD = "dead"  # given up on
    UNKNOWN = "unknown"  # never added to this job


class FailOutcome(str, enum.Enum):
    RETRY = "retry"
    DEAD = "dead"
    IGNORED = "ignored"  # the caller does not hold the item (stale token), or it is done or dead


class Fault(str, enum.Enum):
    """Whose fault a failed attempt was, which decides what it counts against."""

    ITEM = "item"  # its download or save raised: counts against max_retries
    LOST = "lost"  # the worker holding it vanished, or its body was lost: counts against max_lost
    FREE = "free"  # neither (e.g. the broker refused the save message): counts nothing


class SaveStart(str, enum.Enum):
    """Result of :meth:`Tracker.begin_save`."""

    OK = "ok"  # the caller saves under the current token
    BUSY = "busy"  # a run of this save holds a live lease: a duplicate delivery, try later
    STALE = "stale"  # the item was handed on since; a save may still complete it
    DONE = "done"  # already saved: nothing to do
    DEAD = "dead"  # given up on (perhaps just now: its saves kept killing their worker)
    UNKNOWN = "unknown"


class JobState(str, enum.Enum):
    """Where a job is in its life; only running and paused jobs are maintained by workers.
    Finished, cancelled and expired jobs have ended (:attr:`ended`)."""

    RUNNING = "running"
    PAUSED = "paused"  # nothing is dispatched; what is in flight goes on
    CANCELLED = "cancelled"  # as paused, for good (until resumed); the job counts as ended
    FINISHED = "finished"  # nothing was left to do; new items (or a next generation) run it
    # Its max_duration ran out: it dispatched nothing more, what was in flight came back, and
    # its queued items stay queued (counted in its final figures). For good: new items wait.
    EXPIRED = "expired"


    @property
    def ended(self) -> bool:
        """Whether the job has ended (its end time and final figures are recorded)."""
        return self in (JobState.FINISHED, JobState.CANCELLED, JobState.EXPIRED)


class JobAction(str, enum.Enum):
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"


@dataclass(frozen=True)
class JobInfo:
    """A job's state, its start and end (Unix seconds on the tracker's clock; ``ended`` only
    for a job that ended) and its ``final`` figures (seen, done, dead; and queued, the items an
    expired job left in its queues) when it ended."""

    job: str
    state: JobState
    started: Optional[float] = None
    ended: Optional[float] = None
    final: Mapping[str, int] = field(default_factory=dict)
    # Which run of the job this is (1 until it first runs again), and when its schedule next
    # starts one (Unix seconds on the tracker's clock; None without a schedule, or paused).
    generation: int = 1
    next_due: Optional[float] = None
    schedule: Optional[str] = None  # the schedule's text (see core/schedules.py)
    schedule_paused: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state.value, "started": self.started, "ended": self.ended,
                "final": dict(self.final) or None, "generation": self.generation,
                "schedule": self.schedule, "schedule_paused": self.schedule_paused,
                "next_due": self.next_due}


@dataclass(frozen=True)
class Checkout:
    status: LeaseStatus
    depth: int
    failed_attempts: int
    token: int = 0  # the lease's fencing token (0 unless status is OK)
    dispatch: list[str] = field(default_factory=list)
    wait: float = 0.0  # THROTTLED: seconds until the domain's next fetch slot opens
    # Which creation of the job answered ('' if unknown): a job deleted and seeded again under
    # its name is another creation, and what a worker built from the first must not serve it.
    created: str = ""
    # A job that revisits: what fetching the item again needs, if it is known from an earlier
    # generation (tracker/revisits.py); None otherwise.
    record: Optional[Record] = None


class Urgent(str):
    """An item handed out for dispatch whose message goes ahead of those waiting in the broker
    (where the broker allows it): its domain's fetches take at least twice the job's mean, and
    while the message waits it holds one of the domain's places under its concurrency cap. It
    equals, and serializes as, the plain item."""

    __slots__ = ()


@dataclass(frozen=True)
class Dispatchable:
    """Result of a tracker call that may also hand out items to publish as tasks."""

    dispatch: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AddResult(Dispatchable):
    added: int = 0


@dataclass(frozen=True)
class ScrapedResult(Dispatchable):
    added: int = 0
    held: bool = False  # False: the caller's lease was stale, the item was left alone


@dataclass(frozen=True)
class SaveBegin(Dispatchable):
    status: SaveStart = SaveStart.UNKNOWN
    lost: int = 0  # times the item's holder vanished so far
    body: Optional[bytes] = None  # with OK or STALE, the body staged for this save; None: gone
    created: str = ""  # which creation of the job answered, as in Checkout


@dataclass(frozen=True)
class CompleteResult(Dispatchable):
    changed: bool = False


@dataclass(frozen=True)
class GenerationResult(Dispatchable):
    """How a call to start a job's next generation went: ``started`` (or why not: ``current``,
    ``moved``, ``early``, or the job's state), the job's generation now and its next due time."""

    status: str = "started"
    generation: int = 1
    next_due: Optional[float] = None

    @property
    def started(self) -> bool:
        return self.status == "started"


@dataclass(frozen=True)
class FailResult(Dispatchable):
    outcome: FailOutcome = FailOutcome.IGNORED


@dataclass(frozen=True)
class MaintainResult(Dispatchable):
    reclaimed: int = 0  # expired leases and save-pending items: a holder or a message vanished
    died: int = 0
    # Dispatched items whose message did not start within a lease (lost, or waiting behind a
    # backlog): queued again, which costs nothing.
    requeued: int = 0
    # Seconds until a domain's turn or a backoff ends while the broker has room (None: nothing
    # waits for time): maintaining again then dispatches more.
    wake: Optional[float] = None
    finished: bool = False  # this call found the job finished (exactly one call does)
    expired: bool = False  # this call recorded the job expired (exactly one call does)


@dataclass(frozen=True)
class ControlResult(Dispatchable):
    before: JobState = JobState.RUNNING
    after: JobState = JobState.RUNNING


@dataclass(frozen=True)
class RetryDeadResult(Dispatchable):
    requeued: int = 0


@dataclass(frozen=True)
class DomainStats:
    """One domain of a job now: its ``queued`` items (the entries of its queue: one whose item
    moved on counts until it is popped), those ``in_flight`` (dispatched or leased), its
    ``dead`` items, and its fetches' moving mean duration in seconds (``mean_fetch``; None
    before its first, and once it has nothing left). Done items are not counted by domain."""

    domain: str
    queued: int = 0
    in_flight: int = 0
    dead: int = 0
    mean_fetch: Optional[float] = None


@dataclass(frozen=True)
class DomainLimits:
    """One domain's limits: least seconds between two fetch starts, most items in flight."""

    interval: float = 0.0
    concurrency: int = DOMAIN_CONCURRENCY


@dataclass(frozen=True)
class CrawlLimits:
    """A job's politeness and size limits, enforced by the tracker across the whole cluster.
    ``max_pages`` and ``max_pages_per_domain`` count items when they are added (dead ones too)."""

    default: DomainLimits = DomainLimits()
    overrides: Mapping[str, DomainLimits] = field(default_factory=dict)
    max_pages: Optional[int] = None
    max_pages_per_domain: Optional[int] = None
    id_domain: str = NO_DOMAIN  # the domain of items that are not http(s) URLs (IDs)
    # Hash-tag shards the Redis tracker spreads the job over (a layout matter: the in-memory
    # tracker has one store). Each shard enforces max_pages / shards (see RedisTracker).
    shards: int = 1
    # Seconds from the job's start (its control hash's ``started``, Redis's clock) after which
    # it dispatches nothing more and, once what is in flight is back, ends expired; None: none.
    max_duration: Optional[float] = None
    # What the job's politeness counts by: "host" (each domain) or "ip" (the address a worker
    # resolved the domain's host to, passed with each checkout).
    pace: str = "host"

    def for_domain(self, domain: str) -> DomainLimits:
        return self.overrides.get(domain, self.default)

    def policy_fields(self) -> dict[str, Any]:
        """The fields of the Redis ``policy`` hash (see tracker/redis/lua/_lib_call.lua)."""
        out: dict[str, Any] = {
            "interval": self.default.interval, "concurrency": self.default.concurrency,
            "id_domain": self.id_domain,
        }
        for domain, lim in self.overrides.items():
            out[f"i:{domain}"], out[f"c:{domain}"] = lim.interval, lim.concurrency
        if self.max_pages is not None:
            out["max_pages"] = self.max_pages
        if self.max_pages_per_domain is not None:
            out["max_pages_per_domain"] = self.max_pages_per_domain
        if self.pace != "host":
            out["pace"] = self.pace
        return out


# Why an item may be done without a save (Tracker.complete's ``skipped``), each the name of the
# job's counter of such items: its page said noindex, or named another page as its canonical URL.
SKIP_COUNTERS = ("noindex", "canonical")


@dataclass(frozen=True)
class JobStats:
    """Counts of a job's items by state. ``queued`` is the frontier plus dispatched items;
    ``leased`` counts items being scraped or saved (leased and saving); ``save_pending`` items
    wait for their save; ``delayed`` items wait out a backoff before they are queued again.
    ``links_cut`` counts the links pages had past the job's max_links_per_page (or past twice
    that many hrefs looked at), which were not added: counted, not resolved, so some may have
    been repeats. A job that revisits counts, among ``done``, the pages found ``unchanged`` (not
    saved) and ``gone`` (a 404 or 410), and ``known`` the items it keeps a record of.
    ``noindex`` and ``canonical`` count, among ``done``, the pages not saved because they said
    noindex, or named another page as their canonical URL (:data:`SKIP_COUNTERS`).
    Every count but ``known`` is the current generation's.

    :meth:`to_dict` (``distscrape status --json``) names ``save_pending`` ``saving``, as it
    always has: scripts and dashboards read that name."""

    seen: int
    frontier: int
    dispatched: int
    leased: int
    done: int
    dead: int
    save_pending: int = 0
    delayed: int = 0
    links_cut: int = 0
    unchanged: int = 0
    gone: int = 0
    known: int = 0
    noindex: int = 0
    canonical: int = 0

    @property
    def saved(self) -> int:
        """The done items that were saved: neither found unchanged or gone by a revisit, nor
        left unsaved by what their page said."""
        return self.done - self.unchanged - self.gone - self.noindex - self.canonical

    @property
    def queued(self) -> int:
        return self.frontier + self.dispatched

    @property
    def started(self) -> bool:
        return self.seen > 0

    @property
    def finished(self) -> bool:
        return (
            self.started and self.queued == 0 and self.leased == 0 and self.save_pending == 0
            and self.delayed == 0
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "seen": self.seen,
            "queued": self.queued,
            "frontier": self.frontier,
            "dispatched": self.dispatched,
            "leased": self.leased,
            "saving": self.save_pending,
            "delayed": self.delayed,
            "done": self.done,
            "dead": self.dead,
            "links_cut": self.links_cut,
            "unchanged": self.unchanged,
            "gone": self.gone,
            "known": self.known,
            "noindex": self.noindex,
            "canonical": self.canonical,
            "finished": self.finished,
        }


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    concurrency: int
    last_seen: Optional[float]
    alive: bool
