"""A job's cookie jar, shared by all of its workers in Redis: the cookies its responses set,
sent back on the requests they match. http.cookiejar does the reading of Set-Cookie and the
matching (RFC 6265's domain, path, secure and expiry rules, as its DefaultCookiePolicy applies
them); this module only keeps its cookies in Redis between requests, one hash field per cookie
domain (keys: :meth:`..tracker.keys.JobKeys.cookies`).

A request asks Redis once (one HMGET of the fields its host may match); a response that sets
no cookie costs nothing more. Bounds: the cookies of a domain (the oldest set go first), and
the bytes of the whole jar (cookies beyond are not kept)."""

from __future__ import annotations

import http.cookiejar
import json
import logging
import time
import urllib.request
import warnings
from collections import defaultdict
from typing import Any, Optional, Protocol

import redis

from ..errors import FetchError
from ..tracker import keys
from ..tracker.redis import scripts

log = logging.getLogger(__name__)
# http.cookiejar warns, with a traceback, of each Set-Cookie it fails to read, then raises: the
# raise is handled (and logged) in JobCookies.receive, the warning would only repeat it on stderr.
warnings.filterwarnings("ignore", message="http.cookiejar bug!", category=UserWarning)

# The longest cookie kept, its name and value together (RFC 6265 asks a client to take 4096
# bytes; a larger one is dropped).
MAX_COOKIE_BYTES = 4096
# The longest a cookie is kept (RFC 6265bis caps Expires and Max-Age at 400 days).
MAX_COOKIE_SECONDS = 400 * 86400
# Who may set a cookie for which domain: http.cookiejar's default rules, and no Domain of a
# country's second level such as .co.uk (it knows no public suffix list beyond that).
_POLICY = http.cookiejar.DefaultCookiePolicy(strict_domain=True)
# The attributes of an http.cookiejar.Cookie kept for it, in its constructor's order.
_FIELDS = (
    "version", "name", "value", "port", "port_specified", "domain", "domain_specified",
    "domain_initial_dot", "path", "path_specified", "secure", "expires", "discard", "comment",
    "comment_url", "rest", "rfc2109",
)


class CookieStore(Protocol):
    """Where the jars of jobs are kept: by job, then cookie domain, each a JSON object of its
    cookies by ``"<path> <name>"``."""

    def get(self, job: str, domains: list[str]) -> list[Optional[str]]:
        """The stored cookies of each of ``domains`` (None where there are none)."""

    def put(self, job: str, domain: str, changes: list[dict], now: float,
            per_domain: int, max_bytes: int) -> bool:
        """Apply ``changes`` ({"k": key, "c": cookie or absent to delete}) to ``domain``'s
        cookies, drop the expired and, past ``per_domain``, the oldest; False if the jar would
        then hold more than ``max_bytes`` (nothing is changed)."""


class RedisCookieStore:
    """A :class:`CookieStore` in Redis (a script keeps each jar within its bounds). A Redis
    error is a retryable :class:`FetchError`: a request sent without the job's cookies could
    end its item for good (a 403 where a session was needed)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._put = scripts.register(client, "cookies_put")

    def get(self, job: str, domains: list[str]) -> list[Optional[str]]:
        try:
            values = self.client.hmget(keys.JobKeys(job).cookies, domains)
        except redis.RedisError as exc:
            raise _unavailable(exc) from None
        return [v.decode() if isinstance(v, bytes) else v for v in values]

    def put(self, job: str, domain: str, changes: list[dict], now: float,
            per_domain: int, max_bytes: int) -> bool:
        job_keys = keys.JobKeys(job)
        try:
            return bool(self._put(keys=[job_keys.cookies, job_keys.cookie_bytes],
                                  args=[domain, repr(now), per_domain, max_bytes,
                                        json.dumps(changes, separators=(",", ":"))]))
        except redis.RedisError as exc:
            raise _unavailable(exc) from None


def _unavailable(exc: redis.RedisError) -> FetchError:
    return FetchError(f"the job's cookie jar is unavailable: {exc}", retryable=True)


class _Headers:
    """One Set-Cookie header as http.cookiejar reads a response's (``get_all``)."""

    def __init__(self, value: str) -> None:
        self.value = value

    def get_all(self, name: str, default: Any = None) -> Any:
        return [self.value] if name == "Set-Cookie" else default


class _Response:
    def __init__(self, value: str) -> None:
        self._headers = _Headers(value)

    def info(self) -> _Headers:
        return self._headers


class _RecordingJar(http.cookiejar.CookieJar):
    """A jar that notes which cookies a response deleted (an expiry in the past): http.cookiejar
    clears them from the jar itself, which here holds none of the stored cookies."""

    def __init__(self) -> None:
        super().__init__(_POLICY)
        self.deleted: list[tuple[str, str, str]] = []

    def clear(self, domain: Optional[str] = None, path: Optional[str] = None,
              name: Optional[str] = None) -> None:
        if domain is not None and path is not None and name is not None:
            self.deleted.append((domain, path, name))
        super().clear(domain, path, name)


def _key(cookie: http.cookiejar.Cookie) -> str:
    return f"{cookie.path} {cookie.name}"


def _to_json(cookie: http.cookiejar.Cookie, now: float) -> dict:
    if cookie.expires is not None:
        cookie.expires = min(cookie.expires, int(now) + MAX_COOKIE_SECONDS)
    data = {field: getattr(cookie, field) for field in _FIELDS if field != "rest"}
    data["rest"] = dict(cookie._rest)  # type: ignore[attr-defined]  # no public accessor
    data["t"] = int(time.time() * 1_000_000)
    return data


def _from_json(data: dict) -> http.cookiejar.Cookie:
    return http.cookiejar.Cookie(**{field: data[field] for field in _FIELDS})


class JobCookies:
    """The jar of job ``job`` in ``store``: :meth:`header` for a request, :meth:`receive` for
    its response. Threads may share it."""

    def __init__(self, store: CookieStore, job: str, *, per_domain: int, max_bytes: int) -> None:
        self.store = store
        self.job = job
        self.per_domain = per_domain
        self.max_bytes = max_bytes
        self._policy = _POLICY

    def header(self, url: str) -> Optional[str]:
        """The Cookie header a request of ``url`` sends, or None when no stored cookie
        matches it."""
        request = urllib.request.Request(url)
        domains = _domains_of(http.cookiejar.eff_request_host(request)[1])
        stored = [value for value in self.store.get(self.job, domains) if value]
        if not stored:
            return None
        jar = http.cookiejar.CookieJar(self._policy)
        for value in stored:
            for data in json.loads(value).values():
                jar.set_cookie(_from_json(data))
        jar.add_cookie_header(request)
        return request.get_header("Cookie")

    def receive(self, url: str, headers: Any) -> None:
        """Keep the cookies that the response to ``url`` with ``headers`` (urllib3's) sets,
        as far as the policy lets ``url`` set them; forget those it deletes."""
        if "Set-Cookie" not in headers:
            return  # (Set-Cookie2 is obsolete, and ignored as the default policy does)
        request = urllib.request.Request(url)
        jar = _RecordingJar()
        changes: dict[str, list[dict]] = defaultdict(list)
        now = time.time()
        cookies = []
        for value in headers.getlist("Set-Cookie"):
            try:
                cookies += jar.make_cookies(_Response(value), request)
            except Exception as exc:  # a malformed Set-Cookie costs itself, never the page
                log.info("%s: unreadable Set-Cookie of %s ignored: %r", self.job, url, exc)
        for cookie in cookies:
            if (self._policy.set_ok(cookie, request)
                    and len(cookie.name) + len(cookie.value or "") <= MAX_COOKIE_BYTES):
                changes[cookie.domain].append({"k": _key(cookie), "c": _to_json(cookie, now)})
        for domain, path, name in jar.deleted:
            # A site deletes only the cookies it could have set.
            probe = http.cookiejar.Cookie(
                0, name, "", None, False, domain, domain.startswith("."), domain.startswith("."),
                path, True, False, None, True, None, None, {})
            if self._policy.set_ok_domain(probe, request):
                changes[domain].append({"k": f"{path} {name}"})
        for domain, domain_changes in changes.items():
            if not self.store.put(self.job, domain, domain_changes, now, self.per_domain,
                                  self.max_bytes):
                log.info("%s: cookie jar full (fetch.cookie_bytes=%d): cookies of %s not kept",
                         self.job, self.max_bytes, domain)


def _domains_of(host: str) -> list[str]:
    """The cookie domains whose cookies a request to ``host`` (http.cookiejar's effective host
    name, lower case) may receive: its own host-only cookies, and the Domain cookies of it and
    of each domain above it."""
    domains = [host]
    if host.replace(".", "").isdigit() or host.startswith("["):
        return domains  # an IP address has no domain above it
    labels = host.split(".")
    domains.extend("." + ".".join(labels[i:]) for i in range(len(labels) - 1))
    return domains
