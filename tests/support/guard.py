"""Resolvers for the SSRF guard, so that no test asks real DNS."""

from __future__ import annotations

import socket

from distscrape_celery.web.ssrf import address_kind


def resolver(table: dict[str, list[str]]):
    def resolve(host: str) -> list[str]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        return table[host]

    return resolve


def public_test_hooks(port_hosts: dict[str, str]) -> dict:
    """Guard hooks under which each name in ``port_hosts`` resolves to 127.0.0.1 but counts as a
    public address: a "public" site that is really served on loopback."""
    def classify(host: str, ip) -> str | None:
        return None if host in port_hosts else address_kind(host, ip)

    return {"resolver": resolver({h: ["127.0.0.1"] for h in port_hosts}), "classify": classify}
