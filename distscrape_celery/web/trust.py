"""The certificate authorities this process trusts for TLS, to the sites and to ``https://``
proxies: certifi's bundle, or the operator's (the ``ca_bundle`` setting) instead.

Process-wide, as the settings are: scrapers build their own fetchers (they are plugins), so the
setting cannot be handed to each; :func:`trust` is called where the settings are applied, before
any fetcher opens a connection."""

from __future__ import annotations

from typing import Optional

import certifi

_bundle: str = certifi.where()


def trust(ca_bundle: Optional[str]) -> None:
    """From now on, fetchers built in this process (and its children) trust the CAs of the PEM
    file ``ca_bundle`` (checked by the settings), or certifi's with None. A fetcher that has
    already connected keeps the bundle it was built with."""
    global _bundle
    _bundle = ca_bundle or certifi.where()


def ca_certs() -> str:
    """The PEM file of the CAs trusted now (urllib3's ``ca_certs``)."""
    return _bundle
