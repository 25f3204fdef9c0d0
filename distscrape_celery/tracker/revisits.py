"""What a job that revisits keeps of each known item, and how a revisit went.

A record is packed into a few bytes (the tracker keeps one per known item, so its size is the
job's memory): the tracker writes its first four bytes, when the item is due again, from the
start of the generation that fetched it and the record's interval (complete.lua); a worker
packs the rest. Layout, big-endian: due (u32, Unix seconds: the last second it is not due yet),
depth (u16), interval (u32, seconds), gone (u8: generations in a row that found it gone), digest (8 bytes of the body's
BLAKE2b; zero if none), Last-Modified (u32, Unix seconds; 0 if none), then the ETag as sent,
if it is at most :data:`MAX_ETAG` bytes (a longer one is not kept: the digest decides)."""

from __future__ import annotations

import enum
import hashlib
import struct
from dataclasses import dataclass
from typing import Optional

_HEAD = struct.Struct(">IHIB8sI")
DIGEST_BYTES = 8
# Redis keeps a record in its compact encoding only up to 64 bytes.
MAX_ETAG = 40
_U32 = 2**32 - 1


class RevisitOutcome(str, enum.Enum):
    """How a job that revisits ended an item's fetch (complete.lua's ``revisit``)."""

    SAVED = "saved"  # new or changed: saved
    UNCHANGED = "unchanged"  # a 304, or the same digest: not saved
    GONE = "gone"  # a 404 or 410: kept, to be asked again
    DROPPED = "dropped"  # gone for the job's drop_gone_after generations: forgotten


def digest(body: bytes) -> bytes:
    """The digest a record keeps of a body."""
    return hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest()


@dataclass(frozen=True)
class Record:
    """A known item's record: its depth, the interval before it is due again (seconds), the
    generations in a row it was gone, its body's digest and the validators its server sent."""

    depth: int = 0
    interval: int = 0
    gone: int = 0
    digest: bytes = bytes(DIGEST_BYTES)
    last_modified: int = 0
    etag: str = ""
    due: int = 0  # set by the tracker; 0 in a record a worker packs

    def pack(self) -> bytes:
        """The record as the tracker keeps it (``due`` included)."""
        etag = self.etag.encode("latin-1", "replace")
        if len(etag) > MAX_ETAG:
            etag = b""
        return _HEAD.pack(
            min(max(self.due, 0), _U32), min(max(self.depth, 0), 0xFFFF),
            min(max(self.interval, 0), _U32), min(max(self.gone, 0), 0xFF),
            self.digest[:DIGEST_BYTES].ljust(DIGEST_BYTES, b"\0"),
            min(max(self.last_modified, 0), _U32)) + etag

    def update_hex(self) -> str:
        """What complete.lua takes: the record without its due time, in hex."""
        return self.pack()[4:].hex()

    @classmethod
    def unpack(cls, data: bytes) -> "Record":
        due, depth, interval, gone, body_digest, last_modified = _HEAD.unpack_from(data)
        return cls(depth=depth, interval=interval, gone=gone, digest=body_digest,
                   last_modified=last_modified, etag=data[_HEAD.size:].decode("latin-1"),
                   due=due)

    @classmethod
    def from_hex(cls, text: str) -> Optional["Record"]:
        """The record checkout handed out (hex), or None for ''."""
        return cls.unpack(bytes.fromhex(text)) if text else None


@dataclass(frozen=True)
class RevisitUpdate:
    """What :meth:`Tracker.complete` records of an item's fetch in a job that revisits: the
    ``outcome`` and the item's new record as :meth:`Record.update_hex` gives it (empty only
    with DROPPED)."""

    outcome: RevisitOutcome
    record_hex: str = ""

    @classmethod
    def of(cls, outcome: RevisitOutcome, record: Optional[Record] = None) -> "RevisitUpdate":
        return cls(outcome, record.update_hex() if record is not None else "")

    def args(self) -> list[str]:
        """complete.lua's ARGV[5] and ARGV[6]."""
        return [self.outcome.value, self.record_hex]
