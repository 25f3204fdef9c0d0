"""Every Redis key distscrape-celery uses, built in one place.

Job keys share the hash tag ``{job}`` so that all keys a Lua script touches live in one slot
(Redis Cluster). Key shapes, with ``P = ds:{<job>}:``:

================================  ======  ===================================================
key                               type    holds
================================  ======  ===================================================
``P items``                       hash    item -> state letter + depth (``q``ueued, ``d``ispatched,
                                          ``l``eased, ``s``ave pending, ``S``aving, ``D``one,
                                          ``X`` dead); doubles as the dedup set
``P frontier``                    list    items waiting to be dispatched (stale entries skipped)
``P dispatched``                  zset    item -> deadline; a scrape message for it exists
``P leased``                      zset    item -> deadline; a worker scrapes or saves it
``P pending``                     zset    item -> deadline; its save message waits in the broker
``P owners``                      hash    in-flight item -> "<worker ID> <fencing token>" (worker
                                          "-" while its save message waits in the broker)
``P fails``                       hash    item -> failed attempts that were the item's fault
``P lost``                        hash    item -> times the worker holding it vanished
``P dead``                        hash    item -> reason it was given up on
``P stats``                       hash    counters: seen, queued, done, dead, tokens
``P spec``                        string  the job spec as JSON
``P body:<token>``                string  a downloaded body staged for the save task (has a TTL)
``ds:jobs``                       set     names of every seeded job
``ds:robots:<origin>``            string  a host's robots.txt record (JSON), shared by all jobs
                                          (has a TTL); ``<origin>`` is ``scheme://host[:port]``
``ds:robots-fetch:<origin>``      string  set while one worker fetches that robots.txt (TTL)
``ds:{workers}:info``             hash    worker ID -> JSON description (host, pid, concurrency)
``ds:{workers}:concurrency``      hash    worker ID -> concurrency
``ds:{workers}:heartbeats``       zset    worker ID -> time of its last heartbeat (Redis clock)
``ds:{workers}:seq``              string  counter that hands out worker IDs
================================  ======  ===================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError

PREFIX = "ds"
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")

JOBS = f"{PREFIX}:jobs"
# One hash tag for the worker registry, so the heartbeat script's keys share a cluster slot.
WORKERS = f"{PREFIX}:{{workers}}:info"
WORKER_CONCURRENCY = f"{PREFIX}:{{workers}}:concurrency"
HEARTBEATS = f"{PREFIX}:{{workers}}:heartbeats"
WORKER_SEQ = f"{PREFIX}:{{workers}}:seq"


def robots(origin: str) -> str:
    """Where the robots.txt record of ``origin`` (``scheme://host[:port]``) is cached."""
    return f"{PREFIX}:robots:{origin}"


def robots_fetch(origin: str) -> str:
    """The claim of the worker fetching ``origin``'s robots.txt right now."""
    return f"{PREFIX}:robots-fetch:{origin}"


def check_job_name(job: str) -> str:
    """Return ``job`` if it is a valid job name, else raise :class:`ConfigError`."""
    if not isinstance(job, str) or not JOB_NAME_RE.match(job):
        raise ConfigError(
            f"invalid job name {job!r}: use 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return job


@dataclass(frozen=True)
class JobKeys:
    """The keys of one job."""

    job: str

    def __post_init__(self) -> None:
        check_job_name(self.job)

    @property
    def prefix(self) -> str:
        return f"{PREFIX}:{{{self.job}}}:"

    @property
    def items(self) -> str:
        return self.prefix + "items"

    @property
    def frontier(self) -> str:
        return self.prefix + "frontier"

    @property
    def dispatched(self) -> str:
        return self.prefix + "dispatched"

    @property
    def leased(self) -> str:
        return self.prefix + "leased"

    @property
    def owners(self) -> str:
        return self.prefix + "owners"

    @property
    def fails(self) -> str:
        return self.prefix + "fails"

    @property
    def pending(self) -> str:
        return self.prefix + "pending"

    @property
    def lost(self) -> str:
        return self.prefix + "lost"

    @property
    def dead(self) -> str:
        return self.prefix + "dead"

    @property
    def stats(self) -> str:
        return self.prefix + "stats"

    @property
    def spec(self) -> str:
        return self.prefix + "spec"

    def item_keys(self) -> tuple[str, ...]:
        """The KEYS every item script takes, in the order the scripts name them."""
        return (
            self.items, self.frontier, self.dispatched, self.leased, self.owners, self.stats,
            self.fails, self.dead, self.pending, self.lost, self.spec,
        )

    def body(self, token: int) -> str:
        """Where the body downloaded under lease ``token`` waits for its save."""
        return f"{self.prefix}body:{token}"
