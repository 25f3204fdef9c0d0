"""Seed files: one seed a line (IDs for the ids scraper, URLs otherwise), read lazily, so that a
file of millions of seeds is never held in memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Optional

from .jobspec import seed_item
from .urls import Canonicalizer


@dataclass(frozen=True)
class BadLine:
    """A line of a seed file that is not a seed: its number (from 1) and why."""

    number: int
    reason: str


class SeedFile:
    """The seeds of ``stream``, one a line, as items of a job whose scraper is ``scraper_kind``.

    Blank lines and whitespace around a seed are skipped; each seed is checked and normalised
    like a spec's seeds (:func:`~distscrape_celery.jobspec.seed_item`, with the job's
    ``canonicalizer``). A line that is not a seed
    (or not UTF-8) goes to ``on_bad`` and is skipped. ``bytes_read`` and ``bad`` grow as it is read.
    """

    def __init__(
        self, stream: BinaryIO, scraper_kind: Optional[str], on_bad: Callable[[BadLine], None],
        canonicalizer: Optional[Canonicalizer] = None,
    ) -> None:
        self.stream = stream
        self.scraper_kind = scraper_kind
        self.canonicalizer = canonicalizer
        self.on_bad = on_bad
        self.bytes_read = 0
        self.bad = 0

    def __iter__(self) -> Iterator[str]:
        kind, bytes_read = self.scraper_kind, 0
        for number, raw in enumerate(self.stream, 1):
            bytes_read += len(raw)
            self.bytes_read = bytes_read
            try:
                text = raw.decode("utf-8").strip()
                if not text:
                    continue
                item = seed_item(text, kind, self.canonicalizer)
            except UnicodeDecodeError as exc:
                self._bad(number, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
                continue
            except ValueError as exc:
                self._bad(number, str(exc))
                continue
            yield item

    def _bad(self, number: int, reason: str) -> None:
        self.bad += 1
        self.on_bad(BadLine(number, reason))
