"""A link of a given rate between this machine and a network namespace, for a site served from
inside it: a veth pair (10.213.9.1 here, 10.213.9.2 there) whose far end sends at most RATE
(a token bucket, ``tc tbf``), so what a crawl downloads costs time as on a real network. Needs
root and iproute2. Traffic goes only to the namespace this makes."""

from __future__ import annotations

import os
import subprocess

NEAR, FAR = "10.213.9.1", "10.213.9.2"


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if res.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")


class RateLimitedLink:
    """The namespace and its link; :attr:`address` is the far end, :meth:`prefix` runs a
    command in the namespace. ``rate``: tc's notation (``20mbit``)."""

    def __init__(self, rate: str) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("a rate-limited link needs root (network namespaces, tc)")
        self.ns = f"ds-link-{os.getpid()}"
        self.near = f"dsl{os.getpid() % 100000}"
        self.address = FAR
        _ip("netns", "add", self.ns)
        try:
            _ip("-n", self.ns, "link", "set", "lo", "up")
            _ip("link", "add", self.near, "type", "veth", "peer", "name", "eth0", "netns",
                self.ns)
            _ip("addr", "add", f"{NEAR}/30", "dev", self.near)
            _ip("link", "set", self.near, "up")
            _ip("-n", self.ns, "addr", "add", f"{FAR}/30", "dev", "eth0")
            _ip("-n", self.ns, "link", "set", "eth0", "up")
            # Shaped where the site's answers leave: its bodies are what the rate holds back.
            subprocess.run(["ip", "netns", "exec", self.ns, "tc", "qdisc", "add", "dev", "eth0",
                            "root", "tbf", "rate", rate, "burst", "64kb", "latency", "200ms"],
                           check=True, capture_output=True, timeout=30)
        except BaseException:
            self.close()
            raise

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]

    def close(self) -> None:
        # The veth pair goes with the namespace.
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)
