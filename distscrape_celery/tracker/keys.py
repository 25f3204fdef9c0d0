"""Every Redis key distscrape-celery uses, built in one place.

Job keys share the hash tag ``{job}`` so that all keys a Lua script touches live in one slot
(Redis Cluster). Key shapes, with ``P = ds:{<job>}:``:

================================  ======  ===================================================
key                               type    holds
================================  ======  ===================================================
``P i:<n>``                       hash    live-item bucket ``n``: 63-bit fingerprints of the
                                          items added and not done -> state and depth packed
                                          in one integer (depth * 8 + the code of its state,
                                          :class:`~.model.ItemState`), listpack encoded;
                                          :meth:`JobKeys.item_bucket`,
                                          addressed by linear hashing in _lib_seen.lua.
                                          An item's name is kept only where its state puts it
                                          (its domain's queue, ``delayed``, ``dispatched``,
                                          ``leased``, ``pending``, ``dead``); a done item
                                          leaves its bucket for the seen set
                                          (``P f:<n>``)
``P f:<n>``                       set     seen-set bucket ``n``: 63-bit fingerprints of the
                                          done items, as decimal integers (intset encoded);
                                          :meth:`JobKeys.seen_bucket`, addressed by linear
                                          hashing in _lib_seen.lua
``P k:<n>``                       hash    known-item bucket ``n`` of a job that revisits: 63-bit
                                          fingerprints of the items it saved -> each one's
                                          record (tracker/revisits.py), listpack encoded;
                                          :meth:`JobKeys.known_bucket`, addressed by linear
                                          hashing in _lib_seen.lua (_lib_known.lua). Such a
                                          job keeps its done items here, not in ``P f:<n>``
``P u:<n>``                       list    the names of the items of known-item bucket ``n``
                                          (:meth:`JobKeys.known_names`)
``P q:<domain>``                  list    the domain's queued items of priority 0, waiting to
                                          be dispatched, first in first out (stale entries
                                          skipped); :meth:`JobKeys.domain_queue`
``P q:<domain>/p``                zset    the domain's queued items of any other priority ->
                                          priority, then order of arrival, in one score (higher
                                          priorities and earlier arrivals lower), dispatched
                                          before the list's items if above 0 and after them if
                                          below; :meth:`JobKeys.priority_queue`. A queued item's
                                          priority is kept in its live-item value (its rank,
                                          _lib_call.lua), so one of priority 0 costs nothing more
``P domains``                     zset    domain -> when it may next be dispatched, µs: the
                                          domains with queued items and room under their
                                          in-flight cap
``P inflight``                    hash    domain -> its dispatched and leased items
``P latency``                     hash    domain -> its leases' moving mean duration, µs: how much
                                          earlier its turns come (_lib_politeness.lua)
``P dseen``                       hash    domain -> items added (only with max_pages_per_domain)
``P sitemap-urls``                hash    domain -> entries taken from its sitemaps (the job's
                                          sitemaps.max_urls_per_host bounds them), in the
                                          domain's shard
``P delayed``                     zset    item -> when its backoff ends, µs (``w``aiting items)
``P policy``                      hash    the job's crawl limits (see _lib_call.lua),
                                          each domain's robots.txt Crawl-delay and, with
                                          ``politeness.key = "ip"``, each domain's address
                                          (``a:<domain>``)
``P dispatched``                  zset    item -> deadline (µs); a scrape message for it exists
``P leased``                      zset    item -> deadline (µs); a worker scrapes or saves it
``P pending``                     zset    item -> deadline (µs); its save message waits
``P owners``                      hash    in-flight item -> "<worker ID> <fencing token>" (worker
                                          "-" while its save message waits in the broker)
``P fails``                       hash    item -> failed attempts that were the item's fault
``P lost``                        hash    item -> times the worker holding it vanished
``P dead``                        hash    item -> reason it was given up on
``P redo``                        hash    the items the last generation gave up on, with their
                                          reasons, while a new generation's refill queues them
                                          again (_lib_generation.lua)
``P stats``                       hash    counters: seen, queued, done, dead, tokens,
                                          arrivals (items queued in a priority zset); the
                                          seen set's size, level and split pointer (fn, fl,
                                          fs) and the live-item buckets' (seen - done, il, is);
                                          the known items' size, level and split pointer (kn,
                                          kl, ks); unchanged and gone (revisits' outcomes);
                                          noindex and canonical (done unsaved: what the page
                                          said).
                                          Every count but kn and tokens is the generation's
``P spec``                        string  the job spec as JSON
``P control``                     hash    the job's state (running, paused, cancelled,
                                          finished, expired), its name, started and ended
                                          (Redis clock), its time budget (max_duration), its
                                          figures when it ended (final_seen, ...), whether it
                                          ever queued an item of a priority other than 0
                                          (priorities), its key format (``format``,
                                          :data:`JOB_FORMAT`); its generation (1 when absent),
                                          a refill's cursor (refill: see _lib_generation.lua)
                                          and on shard 0 its schedule (schedule, next_due,
                                          schedule_paused; redis/generations.py)
``P cookies``                     hash    a job's cookie jar (fetch.cookies): cookie domain (as
                                          http.cookiejar keeps it: ``.example.org`` for a
                                          Domain cookie, the host for a host-only one) -> a JSON
                                          object of its cookies, by path and name
                                          (web/cookies.py, cookies_put.lua); shard 0
``P cookie-bytes``                string  the bytes ``P cookies`` holds, its fields and values
``P body:<token>``                string  a downloaded body staged for the save task (has a TTL),
                                          in the shard that handed out the token (body_key)
``P active``                      set     the job's name while this shard has unfinished
                                          work (sharded jobs and any job on Redis Cluster,
                                          where ``ds:active-jobs`` is in another slot: the
                                          tracker mirrors it there, see redis/shards.py)
``ds:{sites}:s:<site>``           string  when the site's next fetch may start, µs (its rate and
                                          Crawl-delay); set with a TTL to that moment, so a site
                                          that is not being paced holds no key
``ds:{sites}:f:<job>:<site>``     zset    item -> lease deadline, µs: the job's fetches under
                                          way from the site (the site's in-flight cap counts every
                                          job's); removed with the job
                                          (:func:`site_fetches_pattern`)
``ds:{sites}:j:<site>``           hash    job -> "<interval µs> <cap> <until µs>": the limits of
                                          the jobs that fetched from the site lately; the
                                          strictest of them is the site's budget
                                          (_lib_politeness.lua). Expires with its last entry
``ds:jobs``                       set     names of every seeded job (removed last by delete)
``ds:active-jobs``                set     jobs the workers maintain: neither finished nor
                                          cancelled
``ds:schedules``                  zset    job -> when its schedule next starts a generation
                                          (Unix seconds): the unpaused schedules, an index of
                                          what control holds (see redis/generations.py)
``ds:{robots}:r:<name>``          string  a host's robots.txt record (JSON: the groups of its
                                          first 500 KiB that apply to the fetching user agent,
                                          re-written and cut to 64 KiB, or its status, and when
                                          it was fetched; has a TTL), shared by the jobs whose
                                          fetch of it is the same. ``<name>`` is
                                          ``<fetch>:<origin>``: ``<fetch>`` digests their user
                                          agent, timeouts and redirect limit; ``<origin>`` is
                                          ``scheme://host[:port]`` (lower case, no user info,
                                          no default port)
``ds:{robots}:fetch:<name>``      string  set while one worker fetches the robots.txt of
                                          ``ds:{robots}:r:<name>`` (TTL)
``ds:{robots}:index``             zset    record name -> when it expires (ms, Redis clock):
                                          the records counted against the cache's bound
                                          (``DISTSCRAPE_ROBOTS_CACHE_BYTES``), soonest out
                                          first when it is passed
``ds:{robots}:sizes``             hash    record name -> the bytes it is counted as
``ds:{robots}:bytes``             string  the sum of ``ds:{robots}:sizes``
``ds:{workers}:info``             hash    worker ID -> JSON description (host, pid, concurrency)
``ds:{workers}:concurrency``      hash    worker ID -> concurrency
``ds:{workers}:heartbeats``       zset    worker ID -> time of its last heartbeat (Redis clock)
``ds:{workers}:seq``              string  counter that hands out worker IDs
================================  ======  ===================================================

A *site* is what a job's politeness is counted by (``politeness.key``): a domain, or the
address a worker resolved the domain's host to. Every job on one Redis shares a site's keys
(``ds:{sites}:``, :data:`SITES`), so two jobs crawling one site share its budget. On a Redis
Cluster a script's keys must share one slot, and the job's cannot share one with another job's:
there each job (each shard of a sharded job) keeps its sites' keys under its own prefix
(``P sites:``, :meth:`JobKeys.sites`), and a site's budget is the job's own.

The ``_lib_*.lua`` files named above are the item scripts' library, in tracker/redis/lua/.

A job spread over ``n`` shards (job spec ``tracker.shards``) has a full set of the keys above
(``body:`` and the ``ds:`` keys aside) per shard: shard 0 is ``P`` itself, so an unsharded job's
keys are the same either way, and shard ``i >= 1`` uses ``ds:{<job>:<i>}:`` (':' cannot occur in a
job name, so no job's keys clash with another's shard). Each shard is its own hash tag, so a
cluster spreads the shards over its masters; an item lives in the shard :func:`shard_of` its
domain, so a domain's politeness state is whole in one shard.

An item's domain is its http(s) URL's host, with ``:port`` if the URL names one; items that are not
http(s) URLs (IDs, also those shaped ``scheme://x``) share one pseudo-domain, the host of the job's
``download_url_fmt``, which is where they are fetched from: so that host's politeness (its in-flight
cap, rate, Crawl-delay and page limit) holds for them all. The item scripts take
the prefix ``P q:`` and append the domain (and ``/p`` for its priority zset; no domain holds a
'/'), inside the job's hash tag, so one cluster slot: the same rule as :meth:`JobKeys.domain_queue`,
:meth:`JobKeys.priority_queue` and :func:`domain_of`, which mirror ``domain_of`` and
``priority_queue`` in _lib_politeness.lua.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass

from ..errors import ConfigError

PREFIX = "ds"
# Matched whole (fullmatch): with match and "$", a name could end in a newline.
JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

JOBS = f"{PREFIX}:jobs"
SCHEDULES = f"{PREFIX}:schedules"
ACTIVE_JOBS = f"{PREFIX}:active-jobs"
# The authority of an http(s) URL, the scheme in any case; the same pattern as domain_of in
# _lib_politeness.lua. Spelled out letter by letter: re.IGNORECASE would also take non-ASCII
# letters ("\u017f" matches "s"), which Lua's patterns do not.
_HTTP_AUTHORITY = re.compile(r"[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*)")
# The pseudo-domain of items that are not http(s) URLs when the job names no download_url_fmt.
NO_DOMAIN = "-"
# The layout of a job's keys. A job whose control hash records another (or none: created before
# the seen set; 2: live items by name in one hash; 3: deadlines in seconds, not microseconds) is
# refused by the item scripts (JOBFORMAT), not mixed with this layout.
JOB_FORMAT = 4
# One hash tag for the worker registry, so the heartbeat script's keys share a cluster slot.
WORKERS = f"{PREFIX}:{{workers}}:info"
WORKER_CONCURRENCY = f"{PREFIX}:{{workers}}:concurrency"
HEARTBEATS = f"{PREFIX}:{{workers}}:heartbeats"
WORKER_SEQ = f"{PREFIX}:{{workers}}:seq"
# The prefix of the sites' politeness keys that every job on one Redis shares (the item scripts
# append ``s:``, ``f:`` or ``j:`` and the site).
SITES = f"{PREFIX}:{{sites}}:"


# The robots.txt cache: one hash tag, so that the script that stores a record and keeps the
# cache within its bound (web/robots_stores.py) touches one cluster slot.
ROBOTS_RECORD_PREFIX = f"{PREFIX}:{{robots}}:r:"
ROBOTS_INDEX = f"{PREFIX}:{{robots}}:index"
ROBOTS_SIZES = f"{PREFIX}:{{robots}}:sizes"
ROBOTS_BYTES = f"{PREFIX}:{{robots}}:bytes"


def robots(name: str) -> str:
    """Where the robots.txt record ``name`` (``<fetch digest>:scheme://host[:port]``) is cached."""
    return ROBOTS_RECORD_PREFIX + name


def robots_fetch(name: str) -> str:
    """The claim of the worker fetching the robots.txt of record ``name`` right now."""
    return f"{PREFIX}:{{robots}}:fetch:{name}"


def site_fetches_pattern(job: str) -> str:
    """A SCAN MATCH pattern of ``job``'s sets of fetches under way in the shared sites (job
    names hold no glob character), as _lib_politeness.lua names them (sites.fetches)."""
    return f"{SITES}f:{check_job_name(job)}:*"


def check_job_name(job: str) -> str:
    """Return ``job`` if it is a valid job name, else raise :class:`ConfigError`."""
    if not isinstance(job, str) or not JOB_NAME_RE.fullmatch(job):
        raise ConfigError(
            f"invalid job name {job!r}: use 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return job


def domain_of(item: str, id_domain: str = NO_DOMAIN) -> str:
    """The domain ``item`` is fetched from: its http(s) URL's ``host[:port]`` in ASCII lower case
    (user info dropped), or ``id_domain`` for any other item. An ID, whatever its shape
    (``a://x``, ``mailto:x``, ``//host/x``), is downloaded from the job's download host, so it
    counts against that host's politeness: it never makes a domain of its own."""
    m = _HTTP_AUTHORITY.match(item)
    if m is None:
        return id_domain
    # bytes.lower() folds ASCII only, as Lua's string.lower does in Redis.
    return m.group(1).rsplit("@", 1)[-1].encode().lower().decode()


def fingerprint(item: str) -> int:
    """The 63-bit fingerprint that knows ``item`` in the live-item buckets and the seen set: the
    same number as ``fingerprint`` in _lib_seen.lua (a * 10**9 + b from the item's
    SHA-1)."""
    h = hashlib.sha1(item.encode()).hexdigest()
    return (int(h[:9], 16) % 2**33) * 10**9 + int(h[9:17], 16) % 10**9


def bucket_of(fp: int, level: int, split: int) -> int:
    """The bucket of fingerprint ``fp`` in a set of buckets at ``level`` and ``split`` (linear
    hashing, as ``bucket_of`` in _lib_seen.lua)."""
    a = fp // 10**9
    n = a % 2**level
    return a % 2 ** (level + 1) if n < split else n


# Shard i of a sharded job hands out fencing tokens from i << SHARD_TOKEN_BITS on (create_job.lua):
# a token names one lease of the whole job, and the shard that handed it out. Exact as Lua numbers
# (doubles) for the 1024 shards a spec allows.
SHARD_TOKEN_BITS = 40


def body_key(job: str, token: int) -> str:
    """Where the body downloaded under lease ``token`` waits for its save: in the slot of the
    shard that handed the token out, so a sharded job's bodies spread over the masters too."""
    return JobKeys(job, token >> SHARD_TOKEN_BITS).body(token)


def shard_of(domain: str, shards: int) -> int:
    """The shard (0 .. shards-1) that holds every item of ``domain``: a hash that is the same
    in every process and Python version (crc32, not ``hash``)."""
    return zlib.crc32(domain.encode()) % shards if shards > 1 else 0


@dataclass(frozen=True)
class JobKeys:
    """The keys of one job, or of one shard of a sharded job (shard 0: the job's own keys)."""

    job: str
    shard: int = 0

    def __post_init__(self) -> None:
        check_job_name(self.job)
        if self.shard < 0:
            raise ValueError(f"shard {self.shard} is negative")

    @property
    def prefix(self) -> str:
        tag = self.job if self.shard == 0 else f"{self.job}:{self.shard}"
        return f"{PREFIX}:{{{tag}}}:"

    @property
    def pattern(self) -> str:
        """A SCAN MATCH pattern of every key of the job (job names hold no glob character)."""
        return self.prefix + "*"

    @property
    def item_buckets(self) -> str:
        """The prefix of every live-item bucket key (the scripts append the bucket number)."""
        return self.prefix + "i:"

    def item_bucket(self, n: int) -> str:
        return self.item_buckets + str(n)

    @property
    def queues(self) -> str:
        """The prefix of every domain queue key (the scripts append the domain)."""
        return self.prefix + "q:"

    def domain_queue(self, domain: str) -> str:
        return self.queues + domain

    def priority_queue(self, domain: str) -> str:
        """The zset of the domain's queued items of a priority other than 0."""
        return self.queues + domain + "/p"

    @property
    def seen_buckets(self) -> str:
        """The prefix of every seen-set bucket key (the scripts append the bucket number)."""
        return self.prefix + "f:"

    def seen_bucket(self, n: int) -> str:
        return self.seen_buckets + str(n)

    @property
    def known_buckets(self) -> str:
        """The prefix of every known-item bucket key (_begin.lua builds it from the
        live-item buckets' prefix and appends the number)."""
        return self.prefix + "k:"

    def known_bucket(self, n: int) -> str:
        return self.known_buckets + str(n)

    @property
    def known_names(self) -> str:
        """The prefix of the lists of the known items' names, one a known-item bucket."""
        return self.prefix + "u:"

    @property
    def domains(self) -> str:
        return self.prefix + "domains"

    @property
    def inflight(self) -> str:
        return self.prefix + "inflight"

    @property
    def sites(self) -> str:
        """The prefix of the job's own sites' politeness keys (a cluster's, see the module doc):
        the shape of :data:`SITES` under the job's hash tag."""
        return self.prefix + "sites:"

    @property
    def latency(self) -> str:
        return self.prefix + "latency"

    @property
    def domain_seen(self) -> str:
        return self.prefix + "dseen"

    @property
    def sitemap_urls(self) -> str:
        return self.prefix + "sitemap-urls"

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

    @property
    def cookies(self) -> str:
        return self.prefix + "cookies"

    @property
    def cookie_bytes(self) -> str:
        return self.prefix + "cookie-bytes"

    @property
    def active(self) -> str:
        """The shard's own active marker (a set holding the job's name while it has work)."""
        return self.prefix + "active"

    def item_keys(self, local_active: bool = False, shared_sites: bool = True) -> tuple[str, ...]:
        """The KEYS every item script takes, in the order the scripts name them. The 19th is
        ``ds:active-jobs``, or with ``local_active`` the shard's :attr:`active` marker, which
        shares the shard's slot (a cluster refuses a script whose keys span slots). The 14th is
        the prefix of the sites' keys: :data:`SITES`, shared by every job, or without
        ``shared_sites`` (a cluster) the job's own :attr:`sites`."""
        return (
            self.item_buckets, self.queues, self.dispatched, self.leased, self.owners, self.stats,
            self.fails, self.dead, self.pending, self.lost, self.spec, self.domains, self.inflight,
            SITES if shared_sites else self.sites, self.domain_seen, self.delayed, self.policy, self.control,
            self.active if local_active else ACTIVE_JOBS, self.seen_buckets, self.latency,
        )

    def body(self, token: int) -> str:
        """Where the body downloaded under lease ``token`` waits for its save."""
        return f"{self.prefix}body:{token}"
