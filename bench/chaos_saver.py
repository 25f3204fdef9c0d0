"""The chaos run's saver: FileItemSaver that also logs every item it saved, to count duplicates.

Each save appends one line (the item) to the file named by CHAOS_SAVES_LOG with O_APPEND, so
lines from many processes never interleave. Benchmark-only: the workers of ``bench.chaos`` load
it as a plug-in (``plugin_modules``); the package reads no such variable.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Union

from distscrape_celery.savers import FileItemSaver
from distscrape_celery.web.fetch import Download


class CountingSaver(FileItemSaver):
    """A FileItemSaver whose every stored item, one at a time or in a group, is also logged."""

    def save(self, item: str, download: Download) -> str:
        where = super().save(item, download)
        _log_saved([item])
        return where

    def save_many(self, entries: Sequence[tuple[str, Download]]) -> list[Union[str, Exception]]:
        outcomes = super().save_many(entries)
        _log_saved([item for (item, _), outcome in zip(entries, outcomes)
                    if not isinstance(outcome, Exception)])
        return outcomes


def _log_saved(items: list[str]) -> None:
    if not items:
        return
    descriptor = os.open(os.environ["CHAOS_SAVES_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                         0o644)
    try:
        os.write(descriptor, "".join(item + "\n" for item in items).encode())
    finally:
        os.close(descriptor)
