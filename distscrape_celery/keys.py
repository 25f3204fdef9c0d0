"""Every Redis key distscrape-celery uses, built in one place.

Job keys share the hash tag ``{job}`` so that all keys a Lua script touches live in one slot
(Redis Cluster). Key shapes, with ``P = ds:{<job>}:``:

================================  ======  ===================================================
key                               type    holds
================================  ======  ===================================================
``P items``                       hash    item -> state letter + depth (``q``ueued, ``w``aiting
                                          out a backoff, ``d``ispatched, ``l``eased, ``s``ave
                                          pending, ``S``aving, ``D``one, ``X`` dead); doubles as
                                          the dedup set
``P q:<domain>``                  list    the domain's queued items, waiting to be dispatched
                                          (stale entries skipped); :meth:`JobKeys.domain_queue`
``P domains``                     zset    domain -> when it may next be dispatched: the domains
                                          with queued items and room under their in-flight cap
``P inflight``                    hash    domain -> its dispatched and leased items
``P slots``                       hash    domain -> when its next fetch may start (rate limit)
``P dseen``                       hash    domain -> items added (only with max_pages_per_domain)
``P delayed``                     zset    item -> when its backoff ends (``w``aiting items)
``P policy``                      hash    the job's crawl limits (see tracker/lua/_lib.lua) and
                                          each domain's robots.txt Crawl-delay
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
``P control``                     hash    the job's state (running, paused, cancelled,
                                          finished), its name, started and ended (Redis clock)
                                          and its figures when it ended (final_seen, ...)
``P body:<token>``                string  a downloaded body staged for the save task (has a TTL)
``ds:jobs``                       set     names of every seeded job (removed last by delete)
``ds:active-jobs``                set     jobs the workers maintain: neither finished nor
                                          cancelled
``ds:robots:<origin>``            string  a host's robots.txt record (JSON), shared by all jobs
                                          (has a TTL); ``<origin>`` is ``scheme://host[:port]``
``ds:robots-fetch:<origin>``      string  set while one worker fetches that robots.txt (TTL)
``ds:{workers}:info``             hash    worker ID -> JSON description (host, pid, concurrency)
``ds:{workers}:concurrency``      hash    worker ID -> concurrency
``ds:{workers}:heartbeats``       zset    worker ID -> time of its last heartbeat (Redis clock)
``ds:{workers}:seq``              string  counter that hands out worker IDs
================================  ======  ===================================================

An item's domain is its URL's host, with ``:port`` if the URL names one; items that are not URLs
(IDs) share one pseudo-domain, the host of the job's ``download_url_fmt``. The item scripts take
the prefix ``P q:`` and append the domain (inside the job's hash tag, so one cluster slot), the
same rule as :meth:`JobKeys.domain_queue` and :func:`domain_of`, which mirror ``domain_of`` in
tracker/lua/_lib.lua.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ConfigError

PREFIX = "ds"
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")

JOBS = f"{PREFIX}:jobs"
ACTIVE_JOBS = f"{PREFIX}:active-jobs"
# The authority of an absolute URL; the same pattern as domain_of in tracker/lua/_lib.lua.
_AUTHORITY = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)")
# The pseudo-domain of items that are not URLs when the job names no download_url_fmt.
NO_DOMAIN = "-"
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


def domain_of(item: str, id_domain: str = NO_DOMAIN) -> str:
    """The domain ``item`` is fetched from: its URL's ``host[:port]`` in ASCII lower case (user
    info dropped), or ``id_domain`` for an item that is not a URL."""
    m = _AUTHORITY.match(item)
    if m is None:
        return id_domain
    # bytes.lower() folds ASCII only, as Lua's string.lower does in Redis.
    return m.group(1).rsplit("@", 1)[-1].encode().lower().decode()


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
    def pattern(self) -> str:
        """A SCAN MATCH pattern of every key of the job (job names hold no glob character)."""
        return self.prefix + "*"

    @property
    def items(self) -> str:
        return self.prefix + "items"

    @property
    def queues(self) -> str:
        """The prefix of every domain queue key (the scripts append the domain)."""
        return self.prefix + "q:"

    def domain_queue(self, domain: str) -> str:
        return self.queues + domain

    @property
    def domains(self) -> str:
        return self.prefix + "domains"

    @property
    def inflight(self) -> str:
        return self.prefix + "inflight"

    @property
    def slots(self) -> str:
        return self.prefix + "slots"

    @property
    def domain_seen(self) -> str:
        return self.prefix + "dseen"

    @property
    def delayed(self) -> str:
        return self.prefix + "delayed"

    @property
    def policy(self) -> str:
        return self.prefix + "policy"

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

    @property
    def control(self) -> str:
        return self.prefix + "control"

    def item_keys(self) -> tuple[str, ...]:
        """The KEYS every item script takes, in the order the scripts name them."""
        return (
            self.items, self.queues, self.dispatched, self.leased, self.owners, self.stats,
            self.fails, self.dead, self.pending, self.lost, self.spec, self.domains, self.inflight,
            self.slots, self.domain_seen, self.delayed, self.policy, self.control, ACTIVE_JOBS,
        )

    def body(self, token: int) -> str:
        """Where the body downloaded under lease ``token`` waits for its save."""
        return f"{self.prefix}body:{token}"
