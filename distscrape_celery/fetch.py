"""HTTP downloads: one pooled session per thread, and limits on time and size always on."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Download:
    """What one fetch produced. ``url`` is the final URL after redirects."""

    url: str
    status: int
    content_type: str
    body: bytes = field(repr=False)

    def meta(self) -> dict:
        """Everything but the body, JSON-ready (travels through the broker; the body never does)."""
        return {"url": self.url, "status": self.status, "content_type": self.content_type}

    @classmethod
    def from_meta(cls, meta: dict, body: bytes) -> "Download":
        return cls(url=meta["url"], status=int(meta["status"]), content_type=meta["content_type"], body=body)
