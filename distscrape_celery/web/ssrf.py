"""SSRF guard: a job reaches private, loopback, link-local and reserved addresses only when it says
``allow_private``, or at an address and port its own seeds name literally (an IP address, or
``localhost``), and then only through a URL that names that address literally too. A DNS answer
never makes an address trusted, whatever name it came for: a host name that resolves to a seed's
private address is refused like any other.

The guard resolves every host a connection is made to, checks each address, and the connection
then goes to an address it checked (:func:`guarded_pool_classes`), so a DNS answer that changes
between the check and the connect (rebinding) cannot slip through.

A job that paces its fetches by address (``politeness.key = "ip"``) has the guard resolve a
host before its lease (:meth:`AddressGuard.pacing_address`); the checked answer is kept for a few
seconds, and the fetch's connection goes to it, so the host is resolved once and the address
the tracker paced is the address connected to.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from typing import Optional, Union
from urllib.parse import urlsplit

from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NameResolutionError, NewConnectionError

from ..errors import DistscrapeError
from ..job.spec import JobSpec
from ..job.urls import DEFAULT_PORTS

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
# host -> the addresses it resolves to (strings); raises socket.gaierror when it does not resolve.
Resolver = Callable[[str], list[str]]
# (host, address) -> what kind of non-public address it is ("a loopback"), or None if public.
Classifier = Callable[[str, IPAddress], Optional[str]]


class AddressRefused(DistscrapeError):
    """A host resolved to an address the job may not reach; permanent."""


def system_resolver(host: str) -> list[str]:
    """The addresses the system resolver gives for ``host``, in its order, each once."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# RFC 6052's well-known NAT64 prefix: the last 32 bits are the IPv4 address reached.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# RFC 6761: these names are the loopback addresses, whatever a resolver says.
LOOPBACK_ADDRESSES: tuple[IPAddress, ...] = (
    ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"),
)


def is_localhost_name(host: str) -> bool:
    """True for ``localhost`` and names under ``.localhost`` (RFC 6761), in any case."""
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def address_kind(host: str, ip: IPAddress) -> Optional[str]:
    """What kind of non-public address ``ip`` is, for a message; None when it is public. An IPv6
    address that stands for an IPv4 one (mapped, NAT64) is judged as that address; one that
    tunnels to an IPv4 one (6to4, Teredo's client) is refused when that address is not public."""
    if isinstance(ip, ipaddress.IPv6Address):
        translated = ip.ipv4_mapped
        if translated is None and ip in NAT64:
            translated = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if translated is not None:
            return address_kind(host, translated)
        tunnel_end = ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if tunnel_end is not None:
            kind = address_kind(host, tunnel_end)
            if kind is not None:
                return kind
        if ip.is_site_local:  # fec0::/10: deprecated, yet is_global says yes
            return "a site-local"
    for kind, flag in (
        ("a loopback", ip.is_loopback), ("a link-local", ip.is_link_local),
        ("a multicast", ip.is_multicast), ("an unspecified", ip.is_unspecified),
        ("a private", ip.is_private), ("a reserved", ip.is_reserved),
    ):
        if flag:
            return kind
    return None if ip.is_global else "a non-public"


def literal_addresses(host: str) -> tuple[IPAddress, ...]:
    """The addresses ``host`` names without DNS: itself if an IP literal (brackets allowed), the
    loopback addresses for a localhost name, else none."""
    try:
        return (ipaddress.ip_address(host.strip("[]")),)
    except ValueError:
        return LOOPBACK_ADDRESSES if is_localhost_name(host) else ()


# How long, in seconds, a host's checked addresses are kept after pacing_address resolved them,
# and for how many hosts at most.
KEEP_SECONDS = 10.0
KEEP_HOSTS = 4096

# (address, port): an endpoint a seed names literally, the only private one a job may reach.
Endpoint = tuple[IPAddress, int]


def literal_endpoints(url: str) -> tuple[Endpoint, ...]:
    """The (address, port) pairs ``url`` names without DNS (see :func:`literal_addresses`), the
    port being the scheme's default when the URL gives none; none for a host name."""
    parts = urlsplit(url)
    port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
    if port is None:
        return ()
    return tuple((ip, port) for ip in literal_addresses(parts.hostname or ""))


class AddressGuard:
    """Resolves hosts for connections and refuses non-public addresses, except at the endpoints
    (address and port) that ``trusted_urls`` (the job's seeds) name literally, and there only
    when the connection's host names that address literally too; or all of them with
    ``allow_private``. A trusted URL given by name trusts nothing: its DNS answers are checked
    like any other, and no name's DNS answer ever reaches a trusted endpoint."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        trusted_urls: Iterable[str] = (),
        resolver: Resolver = system_resolver,
        classify: Classifier = address_kind,
    ) -> None:
        self.allow_private = allow_private
        self.trusted: frozenset[Endpoint] = frozenset(
            endpoint for url in trusted_urls for endpoint in literal_endpoints(url)
        )
        self.resolver = resolver
        self.classify = classify
        # host -> (when it was resolved, monotonic; its checked addresses): pacing_address's
        # answers, for the connection that follows. A plain dict, no lock: its single
        # operations are atomic, and a lock held at a fork would stay held in the child.
        self._kept: dict[str, tuple[float, list[IPAddress]]] = {}

    @classmethod
    def from_spec(cls, spec: JobSpec, **hooks) -> "AddressGuard":
        """The guard of a job: the literal endpoints of its seeds (and download URL) are trusted.
        ``hooks``: ``resolver`` and ``classify``, for tests."""
        return cls(allow_private=spec.fetch.allow_private, trusted_urls=spec.origin_urls(), **hooks)

    def addresses(self, host: str, port: int, *, keep: bool = False) -> list[str]:
        """The addresses to connect to for ``host`` on ``port``, every one checked. Raises
        :class:`AddressRefused`, or ``socket.gaierror`` when ``host`` does not resolve. An answer
        :meth:`pacing_address` kept is used while it is fresh; ``keep``: keep this one."""
        literal = literal_addresses(host)
        resolved = list(literal) or self._resolve(host, keep)
        if not self.allow_private:
            for ip in resolved:
                kind = self.classify(host, ip)
                # Only a host that names the address itself (never a DNS answer) reaches a
                # trusted endpoint: a name resolving to a seed's 127.0.0.1 is any name.
                if kind is not None and not (literal and (ip, port) in self.trusted):
                    raise AddressRefused(self._refusal(host, port, ip, kind, literal))
        return [str(ip) for ip in resolved]

    def pacing_address(self, url: str) -> str:
        """The address a fetch of ``url`` connects to first, resolved and checked now and kept
        for that fetch's connection (:data:`KEEP_SECONDS`), so its host is resolved once; '' if
        it has none the guard allows (the fetch then fails as it would have)."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        try:
            port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 0)
            return self.addresses(host, port, keep=True)[0] if host else ""
        except (AddressRefused, OSError, ValueError):
            return ""

    def _refusal(
        self, host: str, port: int, ip: IPAddress, kind: str, literal: tuple[IPAddress, ...]
    ) -> str:
        """Why ``host`` on ``port`` (at ``ip``, of ``kind``) was refused, and what permits it."""
        # An IP literal host names just itself; a name (localhost too) resolves.
        where = f"{ip} is" if literal == (ip,) else f"{host} resolves to {ip},"
        other_port = literal and any(ip == seed_ip for seed_ip, _ in self.trusted)
        on = f" on port {port}, not the seed's port" if other_port else ""
        return (
            f"refused: {where} {kind} address{on} (only the address and port a seed URL gives "
            "literally are trusted, and only by that literal; --allow-private / "
            "fetch.allow_private permits any)"
        )

    def _resolve(self, host: str, keep: bool = False) -> list[IPAddress]:
        name = host.rstrip(".").lower()
        now = time.monotonic()
        kept = self._kept.get(name)
        if kept is not None and now - kept[0] < KEEP_SECONDS:
            return kept[1]
        resolved = [ipaddress.ip_address(a.partition("%")[0]) for a in self.resolver(host)]
        if not resolved:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} has no address")
        if keep:
            if len(self._kept) >= KEEP_HOSTS:  # answers are kept for seconds: start afresh
                self._kept.clear()
            self._kept[name] = (now, resolved)
        return resolved


def guarded_pool_classes(
    guard: AddressGuard, pools: Optional[dict[str, type[HTTPConnectionPool]]] = None,
) -> dict[str, type[HTTPConnectionPool]]:
    """urllib3 pool classes (a ``PoolManager``'s ``pool_classes_by_scheme``: ``pools``, by
    default urllib3's plain ones) whose every new connection goes to an address ``guard``
    checked. A SOCKS pool's connection is then asked of its proxy by that address."""
    guarded = {}
    for scheme, pool in (pools or {"http": HTTPConnectionPool,
                                   "https": HTTPSConnectionPool}).items():
        connection = pool.ConnectionCls

        def _new_conn(self: HTTPConnection, _connect=connection._new_conn) -> socket.socket:
            return _connect_checked(self, guard, _connect)

        checked = type(connection.__name__, (connection,), {"_new_conn": _new_conn})
        guarded[scheme] = type(pool.__name__, (pool,), {"ConnectionCls": checked})
    return guarded


def _connect_checked(conn: HTTPConnection, guard: AddressGuard, connect) -> socket.socket:
    """urllib3's own connect (and its error mapping), aimed at each checked address in turn.
    The TLS server name and Host header still come from the host name, restored afterwards."""
    name = conn._dns_host
    try:
        addresses = guard.addresses(name, conn.port)
    except socket.gaierror as exc:
        raise NameResolutionError(conn.host, conn, exc) from exc
    try:
        for address in addresses[:-1]:
            conn._dns_host = address
            try:
                return connect(conn)
            except NewConnectionError:
                continue  # the host's next address
        conn._dns_host = addresses[-1]
        return connect(conn)
    finally:
        conn._dns_host = name
