"""Real TLS on loopback: a certificate authority of the tests' own (trustme), the certificate it
signs for 127.0.0.1 and localhost, and the fetchers' trust in it, set only where a test asks."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import trustme

from distscrape_celery.web.trust import trust


@dataclass
class TestCA:
    """A CA whose certificate is in the PEM file ``bundle``, and a server certificate it signed
    for 127.0.0.1 and localhost."""

    __test__ = False  # not a test class, whatever its name

    ca: trustme.CA
    bundle: str
    server: trustme.LeafCert

    @classmethod
    def create(cls, directory: Path) -> "TestCA":
        ca = trustme.CA()
        bundle = directory / "test-ca.pem"
        ca.cert_pem.write_to_path(str(bundle))
        return cls(ca, str(bundle), ca.issue_cert("127.0.0.1", "localhost"))

    def server_context(self, *names: str) -> ssl.SSLContext:
        """What a test server or proxy serves TLS with: this CA's certificate for 127.0.0.1
        and localhost, or for ``names`` if given."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        (self.ca.issue_cert(*names) if names else self.server).configure_cert(context)
        return context


@contextmanager
def trusting(bundle: Optional[str]) -> Iterator[None]:
    """Within the block, fetchers built in this process trust ``bundle`` (None: certifi's)."""
    trust(bundle)
    try:
        yield
    finally:
        trust(None)
