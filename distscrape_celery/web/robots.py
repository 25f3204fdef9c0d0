"""robots.txt: fetched once per origin through the job's guarded fetcher, parsed with protego,
kept in a shared store (Redis, or process memory for the in-memory crawl) for a TTL.

What an answer means (Google's rules): 2xx, the rules of its first 500 KiB; 4xx or an unusable
file, allow everything; 5xx, 429 or an unreachable host, nothing may be fetched for now (the item
is retried later).

The store keeps what the host answered for one kind of fetch, never a job's decision: a record is
named by the origin and a digest of what the request sends and waits for (user agent, timeouts,
redirects), each job reads the record only while it is fresh by its own TTLs, and a fetch the
job's own guard refused is not shared. The origin is ``scheme://host[:port]``: scheme and host in
lower case (the host IDNA-encoded), no user info, no default port, so that ``http://u@h:80/`` and
``http://H/`` share one record.

What a record holds is small and bounded, whatever the file: of the file's first 500 KiB, only the
groups that can apply to the digest's user agent (its own and ``*``; ``Allow``, ``Disallow``,
``Crawl-delay``, ``Request-rate``) and the ``Sitemap`` lines, written out again, and cut at
:data:`MAX_ROBOTS_RECORD_BYTES` (the rules before the cut hold, as for the 500 KiB mark; a group
cut before its first rule is left out whole). Filtering by user agent is sound because the user
agent is in the record's name. The records of all jobs together are bounded by the worker setting
``robots_cache_bytes``: past it the records nearest their expiry are dropped (and fetched again
when next needed).

Nothing a site sends makes this module raise: a malformed number (``Crawl-delay``,
``Request-rate``) is ignored or cut to :data:`MAX_CRAWL_DELAY`, and a fetch that raises anyway
ends its claim, so other threads need not wait it out.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Protocol
from urllib.parse import urlsplit

import redis
from protego import Protego

from ..tracker import keys
from ..tracker.redis import scripts
from ..settings import DEFAULT_ROBOTS_CACHE_BYTES
from ..caches import ByteBoundedCache, text_bytes
from ..errors import FetchError
from .fetch import Fetcher
from ..job.sections import FetchSpec
from ..job.spec import JobSpec
from .ssrf import AddressGuard, AddressRefused

log = logging.getLogger(__name__)

DISALLOWED = "disallowed by robots.txt"
# Google reads the first 500 KiB and ignores the rest; a larger file is cut there, not refused.
MAX_ROBOTS_BYTES = 500 * 1024
# Parsed files kept per process, by their size: protego's rules take some 40 to 60 times the
# file's text (a 512 KiB file, 30 MB), so a count of files bounds nothing.
PARSED_ROBOTS_BYTES = 64 * 1024 * 1024
_PARSED_PER_CHAR = 64
# The most one stored record takes (its JSON, UTF-8): room for the groups of a large real file
# that apply to one user agent (the biggest sites' are some 10-30 KiB), while a hostile 500 KiB
# file costs the shared Redis an eighth of that, and its parsed rules 4 MB of a process, not 30.
MAX_ROBOTS_RECORD_BYTES = 64 * 1024
# What a record holds besides its rules ("at", the keys, the braces), with room to spare.
_RECORD_FRAME_BYTES = 128
# A failure's reason kept in a record (a redirect's URL may be long).
_MAX_REASON_CHARS = 1000
# The longest Crawl-delay (or Request-rate, as seconds a request) obeyed: a larger one (or a
# hostile one) would all but stop the domain; this still keeps to one request a minute.
MAX_CRAWL_DELAY = 60.0
_DEFAULT_PORTS = {"http": 80, "https": 443}


class RobotsStore(Protocol):
    """Where fetched robots.txt records are shared, by name: ``<fetch digest>:<origin>``, the
    origin as ``scheme://host[:port]`` (see :meth:`RobotsCache.name`). A store keeps its records
    within a bound of bytes (:func:`record_bytes` each), dropping those nearest their expiry."""

    def get(self, name: str) -> Optional[str]:
        """The record stored as ``name``, or None."""

    def put(self, name: str, record: str, ttl: float) -> None:
        """Store ``record`` as ``name`` for ``ttl`` seconds, and end the fetcher's claim (so
        the next fetch, once the record expires, need not wait for the claim to run out)."""

    def claim(self, name: str, seconds: float) -> bool:
        """True if the caller is the one to fetch ``name``'s file now (for ``seconds``)."""

    def release(self, name: str) -> None:
        """End a claim on ``name`` without storing a record."""


def record_bytes(name: str, record: str) -> int:
    """What a record counts as against its store's bound: its text, and its name, which Redis
    holds four times (the record's key, its claim's, the index and the sizes), and some more for
    the keys' own cost."""
    return len(record.encode()) + 4 * len(name.encode()) + 200


class MemoryRobotsStore:
    """A :class:`RobotsStore` in process memory, for the in-memory crawl, holding at most
    ``max_bytes`` (:func:`record_bytes`)."""

    def __init__(self, max_bytes: int = DEFAULT_ROBOTS_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._records: dict[str, tuple[float, str, int]] = {}  # name -> expires, record, bytes
        self._expiries: list[tuple[float, str]] = []  # a heap; stale entries skipped
        self._claims: dict[str, float] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, name: str) -> Optional[str]:
        with self._lock:
            expires, record, _ = self._records.get(name, (0.0, None, 0))
            return record if expires > time.monotonic() else None

    def put(self, name: str, record: str, ttl: float) -> None:
        now = time.monotonic()
        size = record_bytes(name, record)
        with self._lock:
            self._drop(name)
            self._records[name] = (now + ttl, record, size)
            self.bytes += size
            heapq.heappush(self._expiries, (now + ttl, name))
            self._claims.pop(name, None)
            self._trim(now)

    def _drop(self, name: str) -> None:
        entry = self._records.pop(name, None)
        if entry is not None:
            self.bytes -= entry[2]

    def _trim(self, now: float) -> None:
        """Drop the expired records, then those nearest their expiry while over the bound."""
        heap = self._expiries
        while heap and (heap[0][0] <= now or self.bytes > self.max_bytes):
            expires, name = heapq.heappop(heap)
            entry = self._records.get(name)
            if entry is not None and entry[0] == expires:
                self._drop(name)
        if len(heap) > 2 * len(self._records) + 64:  # mostly stale entries: rebuild
            self._expiries = [(entry[0], name) for name, entry in self._records.items()]
            heapq.heapify(self._expiries)

    def claim(self, name: str, seconds: float) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._claims.get(name, 0.0) > now:
                return False
            self._claims[name] = now + seconds
            return True

    def release(self, name: str) -> None:
        with self._lock:
            self._claims.pop(name, None)


class RedisRobotsStore:
    """A :class:`RobotsStore` in Redis, shared by every worker, holding at most ``max_bytes``
    (:func:`record_bytes`) in all: a script stores each record and drops the expired ones, then
    those nearest their expiry while over the bound (keys: :mod:`..tracker.keys`, ``{robots}``).
    A Redis error makes a miss (the file is fetched again), never a failed item."""

    def __init__(self, client: redis.Redis, max_bytes: int = DEFAULT_ROBOTS_CACHE_BYTES) -> None:
        self.client = client
        self.max_bytes = max_bytes
        self._put = scripts.register(client, "robots_put")

    def get(self, name: str) -> Optional[str]:
        try:
            record = self.client.get(keys.robots(name))
        except redis.RedisError as exc:
            log.warning("robots.txt cache unavailable (%s); fetching it again", exc)
            return None
        return record.decode() if isinstance(record, bytes) else record

    def put(self, name: str, record: str, ttl: float) -> None:
        try:
            self._put(
                keys=[keys.robots(name), keys.robots_fetch(name), keys.ROBOTS_INDEX,
                      keys.ROBOTS_SIZES, keys.ROBOTS_BYTES],
                args=[name, record, max(1, int(ttl * 1000)), record_bytes(name, record),
                      self.max_bytes, keys.ROBOTS_RECORD_PREFIX],
            )
        except redis.RedisError as exc:
            log.warning("robots.txt cache unavailable (%s); not kept", exc)
            self.release(name)

    def claim(self, name: str, seconds: float) -> bool:
        try:
            return bool(
                self.client.set(keys.robots_fetch(name), "1", nx=True, px=int(seconds * 1000))
            )
        except redis.RedisError:
            return True

    def release(self, name: str) -> None:
        try:
            self.client.delete(keys.robots_fetch(name))
        except redis.RedisError:
            pass  # the claim runs out by itself


@dataclass(frozen=True)
class _Rules:
    """One origin's robots.txt as this process uses it."""

    parser: Optional[Protego]  # None: everything allowed
    unavailable: Optional[str] = None  # why nothing may be fetched for now
    expires: float = 0.0
    size: int = 0  # about the memory the parsed rules take


# Shared by the jobs of a process; each job's entries are its own (keyed by its cache's id).
_PARSED: ByteBoundedCache[tuple[int, str], _Rules] = ByteBoundedCache(
    PARSED_ROBOTS_BYTES, lambda key, rules: text_bytes(key[1]) + rules.size
)
_CACHE_IDS = itertools.count()


def fetch_digest(spec: FetchSpec) -> str:
    """What a robots.txt fetch under ``spec`` depends on besides the origin: the user agent it
    sends (a site may answer each its own file) and how long and how far it follows the host.
    The body limit is not in it: every fetch reads the same :data:`MAX_ROBOTS_BYTES`."""
    parts = [spec.user_agent, spec.connect_timeout, spec.read_timeout, spec.total_timeout,
             spec.max_redirects]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def robots_head(body: bytes) -> bytes:
    """The part of ``body`` that is read: all of it up to :data:`MAX_ROBOTS_BYTES`, else the
    lines that end before that mark (a line cut there could read as another rule)."""
    if len(body) <= MAX_ROBOTS_BYTES:
        return body
    head = body[:MAX_ROBOTS_BYTES]
    return head[:max(head.rfind(b"\n"), head.rfind(b"\r")) + 1]


def robots_origin(url: str) -> str:
    """The origin whose robots.txt governs ``url``: ``scheme://host[:port]``, scheme and host in
    lower case (a host name IDNA-encoded), no user info, no default port. Raises
    :class:`FetchError` (permanent) for a URL without a usable host or port."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = parts.hostname or ""
        port = parts.port
        if not host.isascii():
            host = host.encode("idna").decode("ascii")
    except (ValueError, UnicodeError) as exc:
        raise FetchError(f"invalid URL {url}: {exc}", retryable=False) from None
    if not host:
        raise FetchError(f"invalid URL {url}: no host", retryable=False)
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc = f"{netloc}:{port}"
    return f"{scheme}://{netloc}"


# Directive names as protego reads them (misspellings included); others are dropped.
_USER_AGENT = frozenset({"user-agent", "useragent", "user agent"})
_RULES = {
    **dict.fromkeys(("allow",), "Allow"),
    **dict.fromkeys(("disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw"),
                    "Disallow"),
    **dict.fromkeys(("crawl-delay", "crawl delay"), "Crawl-delay"),
    **dict.fromkeys(("request-rate", "request rate"), "Request-rate"),
}
_SITEMAP = frozenset({"sitemap", "sitemaps", "site-map"})
_SITE_WIDE = _SITEMAP | {"host"}  # directives that do not end a group
_DIRECTIVES = _USER_AGENT | set(_RULES) | _SITE_WIDE | {"visit-time", "visit time"}


def _directive(line: str) -> Optional[tuple[str, str]]:
    """A line (comment and outer space removed) as (lower-case field, value), as protego reads
    it: ``field: value``, or ``field value`` for a known field; None: no directive."""
    name: Optional[str] = None
    value = ""
    if ":" in line:
        name, raw = line.split(":", 1)
        name, value = name.strip().lower(), raw.strip()
        if name in _DIRECTIVES or not raw or raw[0].isspace():
            return name, value
    words = line.split()
    for count in (1, 2):
        candidate = " ".join(words[:count]).lower()
        if candidate in _DIRECTIVES:
            return candidate, " ".join(words[count:])
    return (name, value) if name is not None else None


@dataclass
class _Group:
    """One group of a robots.txt: its user agents (lower case) and its rule lines, written out."""

    agents: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _groups(text: str) -> tuple[list[_Group], list[str]]:
    """The groups of ``text`` and its sitemaps, grouped as protego groups them: a user-agent line
    after any other directive but a site-wide one starts a group; a rule before the first
    user agent, or without a value, is dropped."""
    groups: list[_Group] = []
    sitemaps: list[str] = []
    current: Optional[_Group] = None
    previous: Optional[str] = None
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        parsed = _directive(line) if line else None
        if parsed is None:
            continue
        name, value = parsed
        if name in _USER_AGENT and (current is None or previous not in _USER_AGENT):
            current = _Group()
            groups.append(current)
        if name not in _SITE_WIDE:
            previous = name
        if not value:
            continue
        if name in _USER_AGENT:
            current.agents.append(value.lower())  # type: ignore[union-attr]
        elif name in _SITEMAP:
            sitemaps.append(value)
        elif name in _RULES and current is not None and current.agents:
            current.lines.append(f"{_RULES[name]}: {value}")
    return groups, sitemaps


def _applies(agent: str, user_agent: str) -> bool:
    """Whether a group of ``agent`` can apply to ``user_agent`` (lower case): ``*``, or the
    token (with or without its own ``*``) within it. Looser than protego's match at token
    boundaries, so that no group it would choose is left out."""
    if agent == "*" or agent in user_agent:
        return True
    bare = agent.replace("*", "")
    return bool(bare) and bare in user_agent


def _encoded_bytes(line: str) -> int:
    """What ``line`` and its line break take in a record's JSON (UTF-8, escapes included)."""
    return len(json.dumps(line, ensure_ascii=False).encode()) - 2 + 2


def robots_rules(text: str, user_agent: str,
                 limit: int = MAX_ROBOTS_RECORD_BYTES - _RECORD_FRAME_BYTES) -> tuple[str, bool]:
    """What a record keeps of robots.txt ``text`` for ``user_agent``: the groups that can apply
    to it (:func:`_applies`), in their order, their rules written out one per line, then the
    sitemaps, cut where the record's JSON would pass ``limit`` bytes (a group cut before its
    first rule is left out whole, so that it allows nothing it did not). Protego reads the result
    as it reads ``text`` for ``user_agent``. Returns the rules and whether they were cut."""
    agent = user_agent.strip().lower()
    groups, sitemaps = _groups(text)
    out: list[str] = []
    used = 0
    for group in groups:
        agents = [a for a in dict.fromkeys(group.agents) if _applies(a, agent)]
        if not agents:
            continue
        # A group without rules still needs a line that ends it: else the next group's user
        # agents would join it (and a user agent with no rules allows everything).
        lines = group.lines or ["Disallow:"]
        head = [f"User-agent: {a}" for a in agents] + lines[:1]
        cost = sum(_encoded_bytes(line) for line in head)
        if used + cost > limit:
            return "\n".join(out), True
        out += head
        used += cost
        for line in lines[1:]:
            cost = _encoded_bytes(line)
            if used + cost > limit:
                return "\n".join(out), True
            out.append(line)
            used += cost
    for url in sitemaps:
        line = f"Sitemap: {url}"
        cost = _encoded_bytes(line)
        if used + cost > limit:
            return "\n".join(out), True
        out.append(line)
        used += cost
    return "\n".join(out), False


def _reason(text: str) -> str:
    """A failure's reason as a record keeps it: at most :data:`_MAX_REASON_CHARS`."""
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + "..."


def _per_request(seconds: int, requests: int) -> float:
    """A Request-rate as seconds a request, however large its numbers (a quotient too large for
    a float is the longest delay obeyed)."""
    try:
        return seconds / requests
    except OverflowError:
        return MAX_CRAWL_DELAY


class RobotsCache:
    """Answers whether a URL may be fetched under its host's robots.txt, and the host's
    Crawl-delay, for one job's user agent."""

    def __init__(
        self, fetcher: Fetcher, store: RobotsStore, *, user_agent: str, ttl: float,
        retry_seconds: float = 10.0,
    ) -> None:
        self.fetcher = fetcher
        self.store = store
        self.user_agent = user_agent
        self.ttl = ttl
        # An unreadable robots.txt is asked again after this long, not after the TTL; its items
        # retry then (their Retry-After), so a robots.txt that was down for a moment costs no item.
        self.retry_seconds = retry_seconds
        self.digest = fetch_digest(fetcher.spec)
        self._id = next(_CACHE_IDS)

    @classmethod
    def from_spec(cls, spec: JobSpec, store: RobotsStore, **guard_hooks) -> "RobotsCache":
        """The job's robots.txt policy, its files fetched within the job's timeouts and guard
        (``guard_hooks``: ``resolver`` and ``classify``, for tests), each read to 500 KiB
        whatever the job's ``max_bytes``."""
        # One byte more than is read, to tell a file cut at the mark from one that ends there.
        limits = spec.fetch.model_copy(update={"max_bytes": MAX_ROBOTS_BYTES + 1})
        # Any content type: robots.txt is read whatever types the scraper keeps.
        fetcher = Fetcher(limits, AddressGuard.from_spec(spec, **guard_hooks),
                          cut_at_max_bytes=True)
        return cls(fetcher, store, user_agent=spec.fetch.user_agent,
                   ttl=spec.fetch.robots_cache_seconds,
                   retry_seconds=spec.fetch.robots_retry_seconds)

    def check(self, url: str) -> None:
        """Raise :class:`FetchError` unless ``url`` may be fetched now: permanent when robots.txt
        disallows it (or ``url`` has no usable host), retryable when the host's robots.txt is
        unavailable."""
        rules = self._rules(url)
        if rules.unavailable is not None:
            raise FetchError(rules.unavailable, retryable=True, retry_after=self.retry_seconds)
        if rules.parser is not None and not rules.parser.can_fetch(url, self.user_agent):
            raise FetchError(DISALLOWED, retryable=False)

    def allowed(self, url: str) -> bool:
        """True if robots.txt lets ``url`` be fetched now."""
        try:
            self.check(url)
        except FetchError:
            return False
        return True

    def crawl_delay(self, url: str) -> Optional[float]:
        """The Crawl-delay (seconds) robots.txt asks of our user agent on ``url``'s host, if
        any (also the Request-rate, as seconds per request), at most :data:`MAX_CRAWL_DELAY`.
        A value that is no number of seconds (negative, not finite) is ignored."""
        parser = self._rules(url).parser
        if parser is None:
            return None
        delay = parser.crawl_delay(self.user_agent)
        rate = parser.request_rate(self.user_agent)
        if rate is not None and rate.requests > 0 and rate.seconds >= 0:
            delay = max(delay or 0.0, _per_request(rate.seconds, rate.requests))
        if delay is None or not 0 <= delay <= math.inf:  # NaN fails both comparisons
            return None
        return min(float(delay), MAX_CRAWL_DELAY)

    def name(self, origin: str) -> str:
        """The store's name for ``origin``'s record as this job fetches it."""
        return f"{self.digest}:{origin}"

    def _rules(self, url: str) -> _Rules:
        origin = robots_origin(url)
        rules = _PARSED.get((self._id, origin))
        if isinstance(rules, _Rules) and rules.expires > time.monotonic():
            return rules
        name = self.name(origin)
        data = self._usable(self.store.get(name)) or self._fetch_shared(name, origin)
        rules = self._parse(data)
        _PARSED.put((self._id, origin), rules)
        return rules

    def _keep(self, data: dict) -> float:
        """How long after its fetch this job uses a record."""
        return min(self.ttl, self.retry_seconds) if "unavailable" in data else self.ttl

    def _usable(self, record: Optional[str]) -> Optional[dict]:
        """``record`` read, if this job may use it: of this layout, and fresh by this job's TTLs
        (another job's may be longer)."""
        try:
            data = json.loads(record) if record is not None else None
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("at"), (int, float)):
            return None
        return data if time.time() - data["at"] < self._keep(data) else None

    def _fetch_shared(self, name: str, origin: str) -> dict:
        """Fetch ``origin``'s robots.txt, unless another worker is doing so: then wait for its
        record (up to one download's time limit) rather than fetch the file twice."""
        budget = self.fetcher.spec.total_timeout + self.fetcher.spec.connect_timeout
        deadline = time.monotonic() + budget
        # A fetcher may end its claim without a record (its guard refused the host): then the
        # next one takes the claim rather than wait it out.
        while not self.store.claim(name, budget):
            time.sleep(0.1)
            data = self._usable(self.store.get(name))
            if data is not None:
                return data
            if time.monotonic() > deadline:
                break
        else:
            # The worker that stored the record may have ended its claim since we looked.
            data = self._usable(self.store.get(name))
            if data is not None:
                self.store.release(name)
                return data
        stored = False
        try:
            data, shared = self._fetch(origin)
            if shared:
                self.store.put(name, json.dumps(data, ensure_ascii=False), self._keep(data))
                stored = True
        finally:
            # Whatever raised (a bug, a worker's time limit), the others must not wait out the
            # claim: the next one to ask fetches the file itself.
            if not stored:
                self.store.release(name)
        return data

    def _fetch(self, origin: str) -> tuple[dict, bool]:
        """The record of ``origin``'s robots.txt, and whether it is the host's answer (to be
        shared) rather than this job's guard's refusal."""
        url = origin + "/robots.txt"
        at = time.time()
        try:
            download = self.fetcher.get(url)
        except FetchError as exc:
            if exc.retryable:
                reason = _reason(f"robots.txt unavailable, retried later: {exc}")
                return {"unavailable": reason, "at": at}, True
            # The job's own fetch of the page is refused too; a job that may reach the host
            # must not read this as the host's "allow everything".
            refused = isinstance(exc.__cause__, AddressRefused)
            return {"allow": _reason(str(exc)), "at": at}, not refused
        if not 200 <= download.status < 300:  # an unfollowed redirect
            return {"allow": f"HTTP {download.status}", "at": at}, True
        text = robots_head(download.body).decode("utf-8", "replace")
        rules, cut = robots_rules(text, self.user_agent)
        if cut:
            log.info("%s: the robots.txt rules for %s past %d bytes are ignored", url,
                     self.user_agent, MAX_ROBOTS_RECORD_BYTES)
        return {"rules": rules, "at": at}, True

    def _parse(self, data: dict) -> _Rules:
        """A record as rules, kept in this process until the store is asked again: after
        ``retry_seconds``, or sooner when the record is older than this job keeps it."""
        left = self._keep(data) - (time.time() - data["at"])
        expires = time.monotonic() + max(0.0, min(self.retry_seconds, left))
        if "unavailable" in data:
            return _Rules(None, unavailable=data["unavailable"], expires=expires,
                          size=text_bytes(data["unavailable"]))
        if "rules" in data:
            try:
                return _Rules(Protego.parse(data["rules"]), expires=expires,
                              size=len(data["rules"]) * _PARSED_PER_CHAR)
            except Exception:  # a file protego cannot read is no file: allow all
                log.warning("unreadable robots.txt; allowing everything", exc_info=True)
        return _Rules(None, expires=expires)
