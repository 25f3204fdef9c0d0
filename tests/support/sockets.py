"""What a process listens on, read from /proc: its listening sockets, TCP and Unix."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

_TCP_LISTEN = "0A"
_UNIX_ACCEPTING = 0x10000  # __SO_ACCEPTCON: a listening Unix socket


@dataclass(frozen=True)
class Listening:
    tcp: list[tuple[str, int]]  # (address, port), over IPv4 and IPv6
    unix_paths: list[str]

    @property
    def tcp_ports(self) -> list[int]:
        return sorted({port for _, port in self.tcp})

    def addresses_on(self, port: int) -> set[str]:
        """The addresses on which TCP ``port`` is listened to."""
        return {address for address, bound in self.tcp if bound == port}


def _address(hex_address: str) -> str:
    """An address as /proc/net prints it (each 32-bit word in host, little-endian, order)."""
    raw = bytes.fromhex(hex_address)
    return str(ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))))


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of every socket ``pid`` has open."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            found.add(target[len("socket:["):-1])
    return found


def listening(pid: int) -> Listening:
    """The TCP addresses and Unix socket paths on which ``pid`` accepts connections."""
    inodes = _socket_inodes(pid)
    tcp = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] == _TCP_LISTEN and fields[9] in inodes:
                    address, _, port = fields[1].rpartition(":")
                    tcp.append((_address(address), int(port, 16)))
    paths = []
    with open(f"/proc/{pid}/net/unix") as fh:
        for line in fh.readlines()[1:]:
            fields = line.split()
            if (len(fields) > 7 and int(fields[3], 16) & _UNIX_ACCEPTING
                    and fields[6] in inodes):
                paths.append(fields[7])
    return Listening(sorted(tcp), sorted(paths))
