"""URL checks and the one normalisation every item URL goes through before it is deduplicated."""

from __future__ import annotations

from urllib.parse import urldefrag, urlsplit, urlunsplit


_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_url(url: str) -> str:
    """Return the form of ``url`` used for dedup: fragment dropped, scheme and host lowercased,
    default port dropped, empty path made ``/``. Raises ``ValueError`` when ``url`` is not an
    absolute http(s) URL."""
    url, _ = urldefrag(url.strip())
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"not an http(s) URL: {url!r}")
    host = (parts.hostname or "").lower()
    if not host:
        raise ValueError(f"URL has no host: {url!r}")
    port = parts.port  # raises ValueError on a malformed port
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None or port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
    if parts.username or parts.password:
        raise ValueError(f"URL carries credentials, refusing it: {url!r}")
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


def url_host(url: str) -> str:
    """The lowercased host of ``url`` (no port)."""
    return (urlsplit(url).hostname or "").lower()
