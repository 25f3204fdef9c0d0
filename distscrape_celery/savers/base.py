"""The saver interface: store what was downloaded, idempotently; and the one disk step every
saver that writes files shares."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Union

from ..web.fetch import Download
from ..job.saver_spec import SaverSpec

if TYPE_CHECKING:
    from ..settings import Settings


class ItemSaver(ABC):
    """Stores downloaded items. One instance per job per worker process.

    ``saves_records``: the saver stores the records extracted from a page
    (:attr:`~Download.records`, filled in before it is called), not the page: a page with no
    records writes nothing and still counts as saved.

    ``open`` and ``close`` are tied to the worker's lifetime. ``job`` names the job and
    ``worker_id`` the worker (a saver that writes shards names them after it and the process).

    ``writes_revisits``: in a job that revisits, a page found unchanged is saved too, as a
    download whose :attr:`~Download.unchanged` is set (its body empty, or the same as before):
    a saver that keeps a history records that it was seen again (the WARC saver writes a
    ``revisit`` record). Other savers never see such a download: the page is not saved again.
    """

    writes_revisits: bool = False
    saves_records: bool = False

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: SaverSpec, *, job: str, worker_id: str) -> "ItemSaver":
        """Build the saver a job's spec describes."""

    @classmethod
    def for_worker(
        cls, spec: SaverSpec, *, job: str, worker_id: str, settings: "Settings"
    ) -> "ItemSaver":
        """Build the saver a job's spec describes in a process with ``settings``: a saver that
        needs what only the workers hold (a database's address and credentials) reads it here.
        The default is :meth:`from_spec`."""
        return cls.from_spec(spec, job=job, worker_id=worker_id)

    def open(self) -> None:
        """Called once before the first save."""

    def close(self) -> None:
        """Called when the worker stops; must flush everything saved so far."""

    @abstractmethod
    def save(self, item: str, download: Download) -> str:
        """Store ``download`` for ``item`` durably and return where it went. Idempotent:
        saving the same item twice leaves one copy. Raises :class:`SaveError` on failure."""

    def commits_groups(self) -> bool:
        """Whether a save batch may hand its items to :meth:`save_many` and mark them done after
        the whole group, in one tracker round trip: a saver that makes a group durable at once,
        or one for which storing an item twice costs no more than a rewrite. Else each is saved
        and marked done in turn, so that a save that kills its process costs the items before it
        no second write (an archive saver would append them twice)."""
        return False

    def save_many(self, entries: Sequence[tuple[str, Download]]) -> list[Union[str, Exception]]:
        """Store several items, each as :meth:`save` would; all of them are durable when it
        returns. Returns, per entry, where it went or the exception its save raised (never
        raises itself). The default saves them one at a time; a saver that can make a group
        durable at once (one disk flush instead of one per item) overrides it and
        :meth:`commits_groups`."""
        results: list[Union[str, Exception]] = []
        for item, download in entries:
            try:
                results.append(self.save(item, download))
            except Exception as exc:
                results.append(exc)
        return results


def fsync_directory(path: Path) -> None:
    """Make the entries of directory ``path`` durable (a file created, renamed or removed in it
    survives a power cut only once its directory is flushed too)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
