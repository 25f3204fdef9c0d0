"""HTTP downloads: one pooled session per thread, and limits on time and size always on."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import requests
import urllib3.exceptions

from .errors import FetchError
from .jobspec import FetchSpec

_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class Download:
    """What one fetch produced. ``url`` is the final URL after redirects."""

    url: str
    status: int
    content_type: str
    body: bytes = field(repr=False)
    fetched_at: float = field(default_factory=time.time)  # Unix time the response arrived

    def meta(self) -> dict:
        """Everything but the body, JSON-ready (travels through the broker; the body never does)."""
        return {
            "url": self.url, "status": self.status, "content_type": self.content_type,
            "fetched_at": self.fetched_at,
        }

    @classmethod
    def from_meta(cls, meta: dict, body: bytes) -> "Download":
        return cls(
            url=meta["url"], status=int(meta["status"]), content_type=meta["content_type"],
            body=body, fetched_at=float(meta.get("fetched_at") or time.time()),
        )


class Fetcher:
    """Downloads http(s) URLs within the limits of a :class:`FetchSpec`.

    Safe to share between threads: each thread gets its own pooled ``requests.Session``.
    """

    def __init__(self, spec: FetchSpec) -> None:
        self.spec = spec
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # No proxies, .netrc credentials or CA bundles from the environment: a crawl must not
            # send a user's credentials to the sites it visits.
            session.trust_env = False
            session.max_redirects = self.spec.max_redirects
            session.headers["User-Agent"] = self.spec.user_agent
            self._local.session = session
        return session

    def get(self, url: str) -> Download:
        """Download ``url``, following redirects. Returns a 2xx or unfollowed 3xx response;
        raises :class:`FetchError` for anything else, never an exception of requests or urllib3."""
        try:
            scheme = urlsplit(url).scheme.lower()
        except ValueError as exc:
            raise FetchError(f"invalid URL {url}: {exc}", retryable=False) from None
        if scheme not in ("http", "https"):
            raise FetchError(f"not an http(s) URL: {url}", retryable=False)
        spec = self.spec
        deadline = time.monotonic() + spec.total_timeout
        timeout = (spec.connect_timeout, _read_timeout(spec))
        try:
            with self._session().get(url, stream=True, timeout=timeout) as response:
                _check_status(response)
                body = self._read_body(response, deadline)
                return Download(
                    url=response.url,
                    status=response.status_code,
                    content_type=response.headers.get("Content-Type", ""),
                    body=body,
                )
        except requests.RequestException as exc:
            raise _request_error(exc, url, spec) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise _urllib3_error(exc, url, spec) from exc

    def _read_body(self, response: requests.Response, deadline: float) -> bytes:
        """The decoded body, read as it arrives so the deadline holds even against a slow drip
        (``iter_content`` would block until a whole chunk had come in)."""
        limit = self.spec.max_bytes
        body = bytearray()
        while chunk := response.raw.read1(_CHUNK_BYTES, decode_content=True):
            body += chunk
            # Decoded bytes count, so max_bytes also caps what a compressed body expands to.
            if len(body) > limit:
                raise FetchError(
                    f"body of {response.url} exceeds max_bytes={limit}", retryable=False
                )
            if time.monotonic() > deadline:
                raise FetchError(
                    f"timed out after {self.spec.total_timeout:g}s (total_timeout) "
                    f"reading {response.url}",
                    retryable=True,
                )
        return bytes(body)


def _read_timeout(spec: FetchSpec) -> float:
    # No single socket read may outlast the whole download's budget.
    return min(spec.read_timeout, spec.total_timeout)


def _check_status(response: requests.Response) -> None:
    status = response.status_code
    if status >= 400:
        retryable = status >= 500 or status in (408, 429)
        raise FetchError(f"HTTP {status} for {response.url}", retryable=retryable)


def _request_error(exc: requests.RequestException, url: str, spec: FetchSpec) -> FetchError:
    """Map an exception requests raised (connecting, redirecting, reading headers)."""
    if isinstance(exc, requests.ConnectTimeout):
        return FetchError(
            f"timed out after {spec.connect_timeout:g}s connecting to {url}", retryable=True
        )
    if isinstance(exc, requests.ReadTimeout):
        return FetchError(f"timed out after {_read_timeout(spec):g}s reading {url}", retryable=True)
    if isinstance(exc, requests.TooManyRedirects):
        return FetchError(f"more than {spec.max_redirects} redirects from {url}", retryable=False)
    if isinstance(
        exc,
        (
            requests.exceptions.InvalidURL,
            requests.exceptions.InvalidSchema,
            requests.exceptions.MissingSchema,
            requests.exceptions.InvalidHeader,
        ),
    ):
        return FetchError(f"invalid URL {url}: {exc}", retryable=False)
    if isinstance(exc, requests.ConnectionError):
        return FetchError(f"{_connection_reason(exc)} for {url}", retryable=True)
    return FetchError(f"request for {url} failed: {exc}", retryable=True)


def _urllib3_error(exc: urllib3.exceptions.HTTPError, url: str, spec: FetchSpec) -> FetchError:
    """Map an exception urllib3 raised: reading the body, or a URL requests let through."""
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return FetchError(f"timed out after {_read_timeout(spec):g}s reading {url}", retryable=True)
    if isinstance(exc, urllib3.exceptions.ProtocolError):
        return FetchError(f"connection broken while reading {url}", retryable=True)
    if isinstance(exc, urllib3.exceptions.DecodeError):
        # The server sent a body its own Content-Encoding does not describe; a retry gets the same.
        return FetchError(f"cannot decode the body of {url}", retryable=False)
    if isinstance(exc, urllib3.exceptions.LocationValueError):
        return FetchError(f"invalid URL {url}: {exc}", retryable=False)
    return FetchError(f"HTTP error for {url}: {exc}", retryable=True)


def _connection_reason(exc: requests.ConnectionError) -> str:
    """A few words on why a connection failed, from the cause urllib3 wrapped."""
    reason = exc.args[0] if exc.args else None
    if isinstance(reason, urllib3.exceptions.MaxRetryError):
        reason = reason.reason
    if isinstance(reason, urllib3.exceptions.NameResolutionError):
        return "cannot resolve host"
    if isinstance(getattr(reason, "__cause__", None), ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS error"
    return "connection failed"
