"""What the saver tests hand a saver and check its output with: a download to save, the hash
that names saved items, and GNU tar's flag for each archive ending."""

from __future__ import annotations

import hashlib

from distscrape_celery.web.fetch import Download

# The flag that makes GNU tar read each kind of tar archive (`tar -t{flag}f`).
GNU_TAR_FLAG = {".tar": "", ".tar.gz": "z", ".tar.bz2": "j"}

# A fixed fetch time: what a saver writes from these downloads does not depend on the day.
FETCHED_AT = 1700000000.25


def download(item: str, body: bytes, status: int = 200, ctype: str = "text/html") -> Download:
    """The download of ``item``: ``body`` with ``status`` and content type ``ctype``."""
    return Download(url=item, status=status, content_type=ctype, body=body, fetched_at=FETCHED_AT)


def sha1(text: str) -> str:
    """The hex SHA-1 of ``text`` (UTF-8), as the savers name items by."""
    return hashlib.sha1(text.encode()).hexdigest()
