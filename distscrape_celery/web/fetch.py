"""HTTP downloads: one urllib3 connection pool per host, shared by a process's threads, limits on
time and size always on, every connection and redirect hop past the SSRF guard (and the job's
robots.txt, see :func:`redirect_check`), and failures classified as retryable or not.

urllib3 directly rather than requests: requests' per-request work (merging settings, preparing
and re-parsing the URL, building its Response) was about half of a download's CPU, and the
crawl is CPU-bound (docs/performance.md)."""

from __future__ import annotations

import email.utils
import fnmatch
import os
import re
import ssl
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Optional, Protocol
from urllib.parse import urldefrag, urljoin, urlsplit

import urllib3
import urllib3.exceptions
from urllib3.util import make_headers, parse_url

from .deadline import Deadline, total_deadline, watched_pool_classes
from ..errors import FetchError
from ..job.sections import FetchSpec
from ..job.spec import JobSpec
from .fetch_policy import FetchPolicy, PolicyRefused, current_policy
from .proxies import check_target, proxy_manager
from .ssrf import AddressGuard, AddressRefused, guarded_pool_classes
from .trust import ca_certs
from ..job.urls import PLAIN_ORIGIN, PLAIN_PATH

# An absolute http(s) URL that urllib3's parse_url would give back unchanged: lower-case host
# name, a port without leading zeros, a path of unreserved characters without "." or ".."
# segments, no query, user info or fragment. Such a URL goes to its pool directly (Fetcher._open).
_PLAIN_TARGET = re.compile(rf"{PLAIN_ORIGIN}({PLAIN_PATH})\Z")

_CHUNK_BYTES = 64 * 1024
# Hosts whose connection pools a fetcher keeps; the least recently used one is dropped beyond
# (its idle connections close). 40 slow hosts crawled at once keep theirs (bench/broad.py).
POOLS = 100
# The most idle connections a host's pool keeps for the next request: the job's per-domain
# concurrency, at most this. A request that finds none idle opens another (never waits).
MAX_CONNECTIONS_PER_HOST = 256
# Statuses worth trying again later; every other 4xx is the request's own fault.
_RETRY_STATUSES = frozenset({408, 425, 429})
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# The longest wait a Retry-After is read as (a day); a longer one, or a date further ahead, is
# cut to it. The item's backoff has its own, shorter cap (politeness.backoff_max).
MAX_RETRY_AFTER = 86400.0
_DELTA_SECONDS = re.compile(r"[0-9]+")
# What every redirect target must pass before it is requested. Scrapers build their own fetchers
# (they are plugins), so the pipeline cannot hand them the job's robots.txt policy; it sets it
# here around a download instead. A context variable, so each thread of a pool has its own.
_redirect_check: ContextVar[Optional[Callable[[str], None]]] = ContextVar(
    "distscrape_redirect_check", default=None
)


# Counts forks: a child process must not use the connections of its parent's pools.
_fork_generation = 0


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


# The validators of the copy a job already has of the page being fetched (a job that revisits):
# sent as If-None-Match and If-Modified-Since, so that its server can answer 304. A context
# variable, as the redirect check, for the scrapers' own fetchers.
_validators: ContextVar[Optional[dict[str, str]]] = ContextVar("distscrape_validators", default=None)


@contextmanager
def conditional(etag: str = "", last_modified: Optional[float] = None) -> Iterator[None]:
    """Within the block, :meth:`Fetcher.get` asks for the page only if it changed since the copy
    whose ``etag`` and ``last_modified`` (Unix seconds) are given: a server that agrees answers
    304, returned as a :class:`Download` with an empty body (:attr:`Download.not_modified`)."""
    headers: dict[str, str] = {}
    if etag:
        headers["If-None-Match"] = etag
    if last_modified:
        headers["If-Modified-Since"] = email.utils.formatdate(last_modified, usegmt=True)
    token = _validators.set(headers or None)
    try:
        yield
    finally:
        _validators.reset(token)


class BodySink(Protocol):
    """Takes a streamed body (:meth:`Fetcher.get` with a sink)."""

    def write(self, chunk: bytes) -> bool:
        """The next piece of the body, decoded; False: read no more of it."""


@contextmanager
def redirect_check(check: Optional[Callable[[str], None]]) -> Iterator[None]:
    """Within the block, every :meth:`Fetcher.get` calls ``check(url)`` on each redirect target
    before requesting it; ``check`` raises :class:`FetchError` to stop there. None: no check."""
    token = _redirect_check.set(check)
    try:
        yield
    finally:
        _redirect_check.reset(token)


@dataclass(frozen=True)
class Download:
    """What one fetch produced. ``url`` is the final URL after redirects."""

    url: str
    status: int
    content_type: str
    body: bytes = field(repr=False)
    fetched_at: float = field(default_factory=time.time)  # Unix time the response arrived
    # The response's validators, for a job that revisits: its ETag and Last-Modified (Unix
    # seconds), if it sent them.
    etag: str = ""
    last_modified: Optional[float] = None
    # A job that revisits: the record its tracker keeps once the page is saved
    # (tracker/revisits.py, Record.update_hex); it travels with the save message. ``unchanged``:
    # the page is as it was (a saver with writes_revisits records only that it was seen again).
    revisit: str = ""
    unchanged: bool = False
    # What the response's headers say of the page itself (web/page_meta.py): its X-Robots-Tag
    # and Link header lines. Read when the page is scraped; not in meta(), a save needs neither.
    robots_tags: tuple[str, ...] = ()
    links: tuple[str, ...] = ()
    # The page's records, for a saver that saves records (ItemSaver.saves_records) and for the
    # redis saver of a job that extracts: dicts of JSON values, each with url, status,
    # fetched_at and job, filled in the save step; never in the meta, never through the broker.
    records: tuple[dict, ...] = ()

    @property
    def not_modified(self) -> bool:
        """The server answered a conditional request with 304: the copy the job has is current."""
        return self.status == 304

    def meta(self) -> dict:
        """Everything but the body, JSON-ready (travels through the broker; the body never does)."""
        meta = {
            "url": self.url, "status": self.status, "content_type": self.content_type,
            "fetched_at": self.fetched_at,
        }
        if self.revisit:
            meta["revisit"] = self.revisit
        if self.unchanged:
            meta["unchanged"] = True
        return meta

    @classmethod
    def from_meta(cls, meta: dict, body: bytes) -> "Download":
        revisit = meta.get("revisit")
        return cls(
            url=meta["url"], status=int(meta["status"]), content_type=meta["content_type"],
            body=body, fetched_at=float(meta.get("fetched_at") or time.time()),
            revisit=revisit if isinstance(revisit, str) else "",
            unchanged=meta.get("unchanged") is True,
        )


class Fetcher:
    """Downloads http(s) URLs within the limits of a :class:`FetchSpec`.

    With a ``guard``, every connection (each redirect hop's too) goes only to addresses it
    allows; without one, anywhere. ``content_types`` (fnmatch patterns of media types), if given,
    are the only types whose body is read. ``cut_at_max_bytes``: a longer body is cut to
    ``max_bytes`` (the rest left unread) instead of failing. ``connections_per_host``: the idle
    connections each host's pool keeps (at most the requests in flight to a host from this
    process; more are closed after their request). Safe to share between threads: they share one
    urllib3 ``PoolManager``, so a kept-alive connection to a host serves whichever thread asks
    next (a pool per thread kept one connection to each of its last 10 hosts, and a thread
    hopping between many hosts connected anew for nearly every request).
    """

    def __init__(
        self,
        spec: FetchSpec,
        guard: Optional[AddressGuard] = None,
        content_types: Optional[Iterable[str]] = None,
        *,
        cut_at_max_bytes: bool = False,
        connections_per_host: int = 8,
    ) -> None:
        self.spec = spec
        self.guard = guard
        self.content_types = tuple(content_types) if content_types is not None else None
        self.cut_at_max_bytes = cut_at_max_bytes
        self.connections_per_host = max(1, min(connections_per_host, MAX_CONNECTIONS_PER_HOST))
        # (fork generation, PoolManager, {origin: its pool}, {proxy URL: its manager}); built
        # on first use in a process.
        self._pools: Optional[tuple[int, urllib3.PoolManager, dict, dict]] = None
        self._headers = {
            "User-Agent": spec.user_agent, "Accept": "*/*",
            **make_headers(accept_encoding=True),
        }
        self._timeout = urllib3.Timeout(connect=spec.connect_timeout, read=_read_timeout(spec))
        # Every request's arguments (no retries or redirects: see _pool).
        self._request_kw = {"redirect": False, "retries": False, "timeout": self._timeout,
                            "preload_content": False, "decode_content": True}

    @classmethod
    def for_job(cls, spec: JobSpec, **guard_hooks) -> "Fetcher":
        """The fetcher of a job: its limits, its SSRF guard (``guard_hooks``: ``resolver`` and
        ``classify``, for tests) and its scraper's allowed content types."""
        politeness = spec.politeness
        most = max([politeness.per_domain_concurrency,
                    *(o.concurrency for o in politeness.domain_overrides.values() if o.concurrency)])
        return cls(
            spec.fetch, AddressGuard.from_spec(spec, **guard_hooks),
            spec.scraper.allowed_content_types, connections_per_host=most,
        )

    def _state(self) -> tuple[int, urllib3.PoolManager, dict, dict]:
        state = self._pools
        if state is None or state[0] != _fork_generation:
            # Two threads may both get here first: one manager wins, the other serves one
            # request and is dropped (its connection closes). No lock: a lock held by another
            # thread at a fork stays held in the child.
            state = self._pools = (_fork_generation, self._new_manager(), {}, {})
        return state

    def _new_manager(self) -> urllib3.PoolManager:
        # urllib3 reads no proxies or .netrc credentials from the environment (requests did,
        # unless told not to): a crawl must not send a user's credentials to the sites it
        # visits. Retries and redirects are ours (each hop is checked), never urllib3's.
        manager = urllib3.PoolManager(
            num_pools=POOLS, headers={**self._headers}, retries=False,
            ca_certs=ca_certs(), maxsize=self.connections_per_host,
        )
        if self.guard is not None:
            # Every new connection, whichever thread opens it, goes to an address the guard
            # checked at that moment; a kept-alive one stays with the address it was opened to.
            manager.pool_classes_by_scheme = guarded_pool_classes(self.guard)
        # Connections the total deadline can cut off in any phase (see total_deadline): the
        # deadline is the current thread's, so a shared connection serves the one using it.
        manager.pool_classes_by_scheme = watched_pool_classes(manager.pool_classes_by_scheme)
        return manager

    def _open(self, url: str) -> urllib3.BaseHTTPResponse:
        """Send the GET of ``url`` (no redirect followed, no retry) and return the response with
        its body unread. A plain URL (_PLAIN_TARGET) goes straight to its origin's connection
        pool, found in a dict by (scheme, host, port): what PoolManager.urlopen would pick after
        parsing the URL and building a pool key, two steps that were about a fifth of a
        download's CPU."""
        _, manager, direct, _ = self._state()
        request_options = self._request_kw
        plain = _PLAIN_TARGET.match(url)
        validators = _validators.get()
        headers = manager.headers if validators is None else {**manager.headers, **validators}
        policy = current_policy()
        if policy is not None:
            return self._open_with(policy, url, headers)
        if plain is None or (plain[3] and int(plain[3]) > 65535):
            return manager.urlopen("GET", url, headers=headers, **request_options)
        scheme, host, port, path = plain.groups()
        origin = (scheme, host, port)
        pool = direct.get(origin)
        if pool is None:
            pool = manager.connection_from_host(
                host, port=int(port) if port else None, scheme=scheme)
            # At most POOLS entries, as in the manager: a pool it evicted (urllib3 2 drops it
            # without closing it) stays usable here until the dict is cleared.
            if len(direct) >= POOLS:
                direct.clear()
            direct[origin] = pool
        return pool.urlopen("GET", path, assert_same_host=False, headers=headers,
                            **request_options)

    def _open_with(
        self, policy: FetchPolicy, url: str, headers: dict[str, str]
    ) -> urllib3.BaseHTTPResponse:
        """:meth:`_open` for a job with a fetch policy: the domain's headers (its credential
        among them), the job's cookies that match ``url``, and the domain's next proxy."""
        rules = policy.for_url(url)
        if rules.error:
            raise FetchError(f"{rules.error}: {url}", retryable=False) from PolicyRefused(
                rules.error)
        headers = {**headers, **rules.headers}
        if policy.cookies is not None:
            cookie = policy.cookies.header(url)
            if cookie:
                headers["Cookie"] = cookie
        proxy = rules.next_proxy()
        if proxy is None:
            return self._state()[1].urlopen("GET", url, headers=headers, **self._request_kw)
        name, proxy_url = proxy
        managers = self._state()[3]
        manager = managers.get(proxy_url)
        if manager is None:
            manager = managers[proxy_url] = proxy_manager(
                proxy_url, self.guard, headers=self._headers,
                maxsize=self.connections_per_host)
        # An HTTP proxy resolves the target itself: the guard checks the worker's own answer
        # first (a SOCKS proxy's connections are the guard's, see proxies.py).
        check_target(url, self.guard, proxy_url)
        try:
            return manager.urlopen("GET", url, headers=headers, **self._request_kw)
        except urllib3.exceptions.ProxyError as exc:
            raise FetchError(f"proxy {name!r} failed for {url}: {_cause(exc)}",
                             retryable=True) from None

    def get(self, url: str, sink: Optional[BodySink] = None) -> Download:
        """Download ``url``, following redirects. Returns a 2xx or unfollowed 3xx response;
        raises :class:`FetchError` for anything else, never an exception of urllib3.
        ``total_timeout`` bounds the whole: every hop's connect, status line, headers and body.
        With ``sink``, the body goes to it a piece at a time as it arrives, and is not kept."""
        _check_scheme(url)
        with total_deadline(self.spec.total_timeout) as deadline:
            return self._get(url, deadline, sink)

    def _get(self, url: str, deadline: Deadline, sink: Optional[BodySink] = None) -> Download:
        spec = self.spec
        visited = {urldefrag(url)[0]}
        current = url
        for _hop in range(spec.max_redirects + 1):
            target = self._get_one(current, deadline, sink)
            if isinstance(target, Download):
                return target
            if target in visited:
                raise FetchError(
                    f"redirect loop: {current} redirects to {target}, already visited "
                    f"(starting from {url})", retryable=False,
                )
            visited.add(target)
            check = _redirect_check.get()
            if check is not None:
                check(target)
            current = target
            if deadline.passed():
                raise FetchError(
                    f"timed out after {spec.total_timeout:g}s (total_timeout) following "
                    f"redirects from {url}", retryable=True,
                )
        raise FetchError(f"more than {spec.max_redirects} redirects from {url}", retryable=False)

    def _get_one(
        self, url: str, deadline: Deadline, sink: Optional[BodySink] = None
    ) -> "Download | str":
        """One request: the download, or the URL its redirect points to."""
        spec = self.spec
        _check_host(url)
        response = None
        try:
            response = self._open(url)
            policy = current_policy()
            if policy is not None and policy.cookies is not None:
                # Before the status is judged: a redirect or an error may set cookies too.
                policy.cookies.receive(url, response.headers)
            # A connection the watchdog shut down ends the headers or the body early, as if the
            # server had closed it: what arrived is incomplete and must not be used.
            if deadline.passed():
                raise _total_timeout(url, spec)
            location = _redirect_target(url, response)
            if location is not None:
                return location
            _check_status(url, response)
            headers = response.headers
            if response.status == 304:
                # No body follows: read to its end, the connection goes back to its pool for
                # the next request (closed unread, a revisit would open one per page).
                response.drain_conn()
                if not _asked_conditionally(url):
                    # It says the copy the request named is current; this one named none.
                    raise FetchError(
                        f"HTTP 304 (not modified) to a request that asked nothing "
                        f"conditionally: {url}", retryable=True, status=304)
                return Download(url=url, status=304, content_type=headers.get("Content-Type", ""),
                                body=b"", etag=headers.get("ETag", ""),
                                last_modified=_http_date(headers.get("Last-Modified")),
                                **_self_description(headers))
            self._check_type(url, response)
            body = (self._read_body(url, response, deadline) if sink is None
                    else self._stream_body(url, response, deadline, sink))
            if deadline.passed():
                raise _total_timeout(url, spec)
            return Download(
                url=url,
                status=response.status,
                content_type=headers.get("Content-Type", ""),
                body=body,
                etag=headers.get("ETag", ""),
                last_modified=_http_date(headers.get("Last-Modified")),
                **_self_description(headers),
            )
        except AddressRefused as exc:
            # Chained, so a caller can tell the guard's refusal from the host's answer.
            raise FetchError(f"{exc}: {url}", retryable=False) from exc
        except urllib3.exceptions.HTTPError as exc:
            if deadline.passed():  # the watchdog cut the connection, or its clamped timeout ran out
                raise _total_timeout(url, spec) from exc
            raise _urllib3_error(exc, url, spec) from exc
        except UnicodeError as exc:  # a host name the IDNA codec refuses, met when resolving
            raise FetchError(f"invalid URL {url}: {exc}", retryable=False) from None
        finally:
            if response is not None:
                # A body read to its end has already given its connection back for the next
                # request; one left unread (a redirect, an error, a limit) closes it.
                response.close()
                response.release_conn()

    def _check_type(self, url: str, response: urllib3.BaseHTTPResponse) -> None:
        if self.content_types is None:
            return
        media_type = media_type_of(response.headers.get("Content-Type", ""))
        if not any(fnmatch.fnmatchcase(media_type, p) for p in self.content_types):
            raise FetchError(
                f"content type {media_type or '(none)'} of {url} is not one of "
                f"allowed_content_types", retryable=False,
            )

    def _read_body(
        self, url: str, response: urllib3.BaseHTTPResponse, deadline: Deadline
    ) -> bytes:
        """The decoded body, read as it arrives so the deadline holds even against a slow drip
        (``iter_content`` would block until a whole chunk had come in)."""
        limit = self.spec.max_bytes
        body = bytearray()
        while chunk := response.read1(_CHUNK_BYTES, decode_content=True):
            body += chunk
            # Decoded bytes count, so max_bytes also caps what a compressed body expands to.
            if len(body) > limit:
                if self.cut_at_max_bytes:
                    return bytes(body[:limit])
                raise FetchError(
                    f"body of {url} exceeds max_bytes={limit}", retryable=False
                )
            if deadline.passed():
                raise _total_timeout(url, self.spec)
        return bytes(body)


    def _stream_body(
        self, url: str, response: urllib3.BaseHTTPResponse, deadline: Deadline, sink: BodySink
    ) -> bytes:
        """:meth:`_read_body`, each piece handed to ``sink`` rather than kept (b"" returned): at
        most ``max_bytes`` of it, and none after ``sink`` said it wants no more."""
        limit, read = self.spec.max_bytes, 0
        while chunk := response.read1(_CHUNK_BYTES, decode_content=True):
            read += len(chunk)
            if read > limit:
                if not self.cut_at_max_bytes:
                    raise FetchError(f"body of {url} exceeds max_bytes={limit}", retryable=False)
                sink.write(chunk[:len(chunk) - (read - limit)])
                break
            if not sink.write(chunk):
                break
            if deadline.passed():
                raise _total_timeout(url, self.spec)
        return b""


def _cause(exc: urllib3.exceptions.ProxyError) -> str:
    """What went wrong with a proxy, without its URL (which may hold its credentials)."""
    inner = getattr(exc, "original_error", None)
    if isinstance(inner, urllib3.exceptions.NewConnectionError):
        return "cannot connect to the proxy"
    why = _unverified(inner)
    if why is not None:
        return f"the proxy's TLS certificate is not trusted: {why} ({_TRUSTED})"
    if isinstance(inner, OSError) and "Tunnel connection failed" in str(inner):
        return str(inner).partition(": ")[2] or "tunnel refused"
    return type(inner or exc).__name__


def _self_description(headers: urllib3.HTTPHeaderDict) -> dict[str, tuple[str, ...]]:
    """The :class:`Download` fields of the headers in which a page speaks of itself."""
    return {"robots_tags": tuple(headers.getlist("X-Robots-Tag")),
            "links": tuple(headers.getlist("Link"))}


# Where a refused certificate's CA would have to be, for the messages that report one.
_TRUSTED = "the CAs trusted are DISTSCRAPE_CA_BUNDLE's, or certifi's without it"


def _unverified(exc: Optional[BaseException]) -> Optional[str]:
    """Why a certificate was refused, if ``exc`` (urllib3's wrapper) reports that; else None."""
    cause = exc.args[0] if isinstance(exc, urllib3.exceptions.SSLError) and exc.args else None
    if isinstance(cause, ssl.SSLCertVerificationError):
        return cause.verify_message or cause.reason or str(cause)
    return None


def _total_timeout(url: str, spec: FetchSpec) -> FetchError:
    return FetchError(
        f"timed out after {spec.total_timeout:g}s (total_timeout) fetching {url}", retryable=True
    )


def _read_timeout(spec: FetchSpec) -> float:
    # No single socket read may outlast the whole download's budget.
    return min(spec.read_timeout, spec.total_timeout)


def media_type_of(content_type: str) -> str:
    """The media type of a Content-Type header, lowercased, without parameters."""
    return content_type.split(";", 1)[0].strip().lower()


def _check_scheme(url: str) -> None:
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as exc:
        raise FetchError(f"invalid URL {url}: {exc}", retryable=False) from None
    if scheme not in ("http", "https"):
        raise FetchError(f"not an http(s) URL: {url}", retryable=False)


def _check_host(url: str) -> None:
    """Refuse a host name with an empty label ("a..b", ".a") before anything is resolved: the
    resolver would fail on it later, as if the network were at fault."""
    if ".." not in url and "/." not in url and "@." not in url:
        # Such a label follows "//" or "@", or another dot: no URL without these has one. Most
        # URLs end here, without a second parse besides urllib3's own.
        return
    try:
        host = parse_url(url).host
    except ValueError:
        return  # urllib3 reports it as an invalid URL
    if host and not host.startswith("[") and "" in host.rstrip(".").split("."):
        raise FetchError(f"invalid URL {url}: empty label in host {host!r}", retryable=False)


def _redirect_target(url: str, response: urllib3.BaseHTTPResponse) -> Optional[str]:
    """The absolute URL a redirect response points to (fragment dropped), or None."""
    if response.status not in _REDIRECT_STATUSES:
        return None
    location = response.headers.get("Location")
    if location is None:
        return None  # a redirect status without a Location is returned as it is
    # http.client decodes headers as latin-1; servers send UTF-8 in practice.
    try:
        location = location.encode("latin-1").decode("utf-8")
    except UnicodeError:
        pass
    try:
        target = urldefrag(parse_url(urljoin(url, location)).url)[0]
        scheme = urlsplit(target).scheme
    except ValueError as exc:
        raise FetchError(f"invalid URL {url}: bad redirect: {exc}", retryable=False)
    if scheme not in ("http", "https"):
        raise FetchError(
            f"invalid URL {url}: redirect to a non-http(s) URL {target}", retryable=False
        )
    return target


# Request headers that make a GET conditional: only to such a request may a server answer 304.
_CONDITIONAL_HEADERS = frozenset({"if-none-match", "if-modified-since"})


def _asked_conditionally(url: str) -> bool:
    """Whether the request of ``url`` carried a validator: the revisit's (:func:`conditional`),
    or one the job's fetch policy sets for its domain."""
    if _validators.get():
        return True
    policy = current_policy()
    return policy is not None and any(
        name.lower() in _CONDITIONAL_HEADERS for name in policy.for_url(url).headers)


def _check_status(url: str, response: urllib3.BaseHTTPResponse) -> None:
    status = response.status
    if status >= 400:
        retryable = status >= 500 or status in _RETRY_STATUSES
        after = retry_after(response.headers.get("Retry-After")) if retryable else None
        message = f"HTTP {status} for {url}"
        if after is not None:
            message += f" (Retry-After {after:g}s)"
        raise FetchError(message, retryable=retryable, retry_after=after, status=status)


def _http_date(value: Optional[str]) -> Optional[float]:
    """An HTTP date header as Unix seconds; None if absent or unreadable (never raises)."""
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP-date), at most
    :data:`MAX_RETRY_AFTER`; None when absent or unreadable. A date in the past is 0. Never
    raises, whatever the server sent."""
    if not value:
        return None
    value = value.strip()
    # ASCII digits only: str.isdigit also takes "²" and other digits float() refuses.
    if _DELTA_SECONDS.fullmatch(value):
        digits = value.lstrip("0")
        # A number of more digits than a day's seconds is not converted: it is cut to a day.
        if len(digits) > len(str(int(MAX_RETRY_AFTER))):
            return MAX_RETRY_AFTER
        return min(float(digits or 0), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:  # an HTTP-date is always GMT
            return None
        wait = when.timestamp() - (time.time() if now is None else now)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return min(max(0.0, wait), MAX_RETRY_AFTER)


def _urllib3_error(exc: urllib3.exceptions.HTTPError, url: str, spec: FetchSpec) -> FetchError:
    """Map an exception urllib3 raised (connecting, sending, reading headers or the body)."""
    # Subclasses before their bases: NameResolutionError is a NewConnectionError, which is a
    # ConnectTimeoutError.
    if isinstance(exc, urllib3.exceptions.NameResolutionError):
        return FetchError(f"cannot resolve host for {url}", retryable=True)
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        refused = isinstance(exc.__cause__, ConnectionRefusedError)
        return FetchError(
            f"{'connection refused' if refused else 'connection failed'} for {url}",
            retryable=True,
        )
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError):
        return FetchError(
            f"timed out after {spec.connect_timeout:g}s connecting to {url}", retryable=True
        )
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return FetchError(f"timed out after {_read_timeout(spec):g}s reading {url}", retryable=True)
    if isinstance(exc, urllib3.exceptions.LocationValueError):
        return FetchError(f"invalid URL {url}: {exc}", retryable=False)
    if isinstance(exc, urllib3.exceptions.DecodeError):
        # The server sent a body its own Content-Encoding does not describe; a retry gets the same.
        return FetchError(f"cannot decode the body of {url}", retryable=False)
    if isinstance(exc, urllib3.exceptions.SSLError):
        why = _unverified(exc)
        if why is not None:
            # The same certificate is refused next time: only the operator's trust changes it.
            return FetchError(f"TLS certificate of {url} is not trusted: {why} ({_TRUSTED})",
                              retryable=False)
        return FetchError(f"TLS error for {url}", retryable=True)
    if isinstance(exc, urllib3.exceptions.ProtocolError):
        return FetchError(f"connection broken while reading {url}", retryable=True)
    return FetchError(f"HTTP error for {url}: {exc}", retryable=True)
