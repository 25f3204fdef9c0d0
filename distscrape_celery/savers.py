"""Savers: store what was downloaded."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

from .fetch import Download
from .jobspec import SaverSpec


class ItemSaver(ABC):
    """Stores downloaded items. One instance per job per worker process.

    ``open`` and ``close`` are tied to the worker's lifetime; ``worker_id`` names the worker
    (a saver that writes shards names them after it).
    """

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: SaverSpec, worker_id: Optional[str] = None) -> "ItemSaver":
        """Build the saver a job's spec describes."""

    def open(self) -> None:
        """Called once before the first save."""

    def close(self) -> None:
        """Called when the worker stops; must flush everything saved so far."""

    @abstractmethod
    def save(self, item: str, download: Download) -> str:
        """Store ``download`` for ``item`` durably and return where it went. Idempotent:
        saving the same item twice leaves one copy. Raises :class:`SaveError` on failure."""
