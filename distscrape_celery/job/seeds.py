"""Seed files: one seed a line (IDs for the ids scraper, URLs otherwise), read lazily and a
bounded piece at a time, so that neither a file of millions of seeds nor one huge line is ever
held in memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Optional

from .spec import seed_item
from .urls import MAX_URL_CHARS, Canonicalizer

# The longest line taken, its line ending aside: the longest seed URL (8192 characters).
MAX_LINE_BYTES = MAX_URL_CHARS


@dataclass(frozen=True)
class BadLine:
    """A line of a seed file that is not a seed: its number (from 1) and why."""

    number: int
    reason: str


class SeedFile:
    """The seeds of ``stream``, one a line, as items of a job whose scraper is ``scraper_kind``.

    Blank lines and whitespace around a seed are skipped; each seed is checked and normalised
    like a spec's seeds (:func:`~distscrape_celery.job.spec.seed_item`, with the job's
    ``canonicalizer``). A line that is not a seed (or not UTF-8, or longer than
    ``MAX_LINE_BYTES``, which is read past in pieces of that size) goes to ``on_bad`` and is
    skipped. ``bytes_read`` and ``bad`` grow as it is read.
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
        kind = self.scraper_kind
        for number, line in enumerate(self._lines(), 1):
            if line is None:
                self._bad(number, f"longer than {MAX_LINE_BYTES} bytes")
                continue
            try:
                text = line.decode("utf-8").strip()
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

    def _lines(self) -> Iterator[Optional[bytes]]:
        """The stream's lines, each with its line ending; None for one too long to take."""
        read = self.stream.readline
        # Room for the longest line and a CRLF: a piece this long without "\n" is too long.
        limit = MAX_LINE_BYTES + 2
        while True:
            piece = read(limit)
            self.bytes_read += len(piece)
            if not piece:
                return
            if len(piece) < limit or piece.endswith(b"\n"):
                yield piece if len(piece.rstrip(b"\r\n")) <= MAX_LINE_BYTES else None
                continue
            # Skip the rest of the line, a piece at a time.
            while piece and not piece.endswith(b"\n"):
                piece = read(limit)
                self.bytes_read += len(piece)
            yield None

    def _bad(self, number: int, reason: str) -> None:
        self.bad += 1
        self.on_bad(BadLine(number, reason))
