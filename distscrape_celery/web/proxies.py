"""The connection managers of the operator's proxies (the workers' ``proxies`` setting), and
what the SSRF guard checks of a request that goes through one.

A SOCKS proxy is told the address to connect to: the guard resolves the target, checks each
address, and the proxy is asked for a checked address (with ``socks5h`` too, so the proxy
resolves nothing). An HTTP(S) proxy is given the target's name (a forwarded request's URL, or
a CONNECT tunnel's) and resolves it itself: the guard checks the worker's own answer before
the request goes out (:func:`check_target`), which a proxy with another view of DNS may not
share. The proxy's own address is the operator's choice and is not checked."""

from __future__ import annotations

import socket
from typing import Optional

import urllib3
from urllib3.util import make_headers, parse_url

from ..errors import FetchError
from ..job.urls import DEFAULT_PORTS
from .deadline import watched_pool_classes
from .ssrf import AddressGuard, guarded_pool_classes
from .trust import ca_certs

# Target hosts a proxy's manager keeps pools for (a SOCKS proxy or an HTTPS target: a pool per
# target; an HTTP target through an HTTP proxy shares the proxy's).
_PROXY_POOLS = 100


def is_socks(proxy_url: str) -> bool:
    return proxy_url.lower().startswith("socks")


def proxy_manager(
    proxy_url: str, guard: Optional[AddressGuard], *, headers: dict[str, str], maxsize: int,
) -> urllib3.PoolManager:
    """A manager whose every request goes through the proxy at ``proxy_url``, with ``headers``
    (the fetcher's own), its connections bounded by the download's total deadline and, for a
    SOCKS proxy, aimed at the addresses ``guard`` checked."""
    common = dict(num_pools=_PROXY_POOLS, headers={**headers}, retries=False,
                  ca_certs=ca_certs(), maxsize=maxsize)
    manager: urllib3.PoolManager
    if is_socks(proxy_url):
        from urllib3.contrib.socks import SOCKSProxyManager

        manager = SOCKSProxyManager(proxy_url, **common)
        if guard is not None:
            manager.pool_classes_by_scheme = guarded_pool_classes(
                guard, manager.pool_classes_by_scheme)
    else:
        # The user info as the operator wrote it in the URL, %-escapes decoded (a password may
        # hold a ':' or an '@' written so).
        auth = parse_url(proxy_url).auth_decoded_joined
        manager = urllib3.ProxyManager(
            proxy_url, proxy_headers=make_headers(proxy_basic_auth=auth) if auth else None,
            **common)
    manager.pool_classes_by_scheme = watched_pool_classes(manager.pool_classes_by_scheme)
    return manager


def check_target(url: str, guard: Optional[AddressGuard], proxy_url: str) -> None:
    """Before ``url`` is requested through the HTTP(S) proxy at ``proxy_url``: raise
    :class:`.ssrf.AddressRefused` if its host resolves (here) to an address the guard refuses,
    :class:`FetchError` if it does not resolve. A SOCKS proxy's connections check their own."""
    if guard is None or is_socks(proxy_url):
        return
    parts = parse_url(url)
    host = (parts.host or "").strip("[]")
    port = parts.port or DEFAULT_PORTS.get((parts.scheme or "").lower(), 80)
    try:
        guard.addresses(host, port)
    except socket.gaierror:
        raise FetchError(f"cannot resolve host for {url}", retryable=True) from None
    except UnicodeError as exc:
        raise FetchError(f"invalid URL {url}: {exc}", retryable=False) from None
