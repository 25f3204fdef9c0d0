"""What a job that revisits keeps of each known item, and how a revisit went.

A record is packed into a few bytes (the tracker keeps one per known item, so its size is the
job's memory): the tracker writes its first four bytes, when the item is due again, from the
start of the generation that fetched it and the record's interval (complete.lua); a worker
packs the rest. Layout, big-endian: due (u32, Unix seconds: the last second it is not due yet),
depth (u8, at most 255), gone (u8: generations in a row that found it gone), interval (u16,
whole minutes, at most 45 days), digest (6 bytes of the body's BLAKE2b; zero if none), then its
validator: a strong ETag without its quotes, 0x01 and a weak ETag as sent, 0x00 and
Last-Modified (u32, Unix seconds) when the server sent no ETag (or one longer than
:data:`MAX_ETAG` bytes), or nothing."""

from __future__ import annotations

import enum
import hashlib
import struct
from dataclasses import dataclass
from typing import Optional

_HEAD = struct.Struct(">IBBH6s")
DIGEST_BYTES = 6
# Redis keeps a record in its compact encoding only up to 64 bytes.
MAX_ETAG = 40
_U32 = 2**32 - 1
_MAX_MINUTES = 0xFFFF
_LAST_MODIFIED, _WEAK = b"\x00", b"\x01"


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
    """A known item's record: its depth, the interval before it is due again (seconds, kept in
    whole minutes), the generations in a row it was gone, its body's digest and the validators
    its server sent (only one is kept: the ETag if any, else Last-Modified)."""

    depth: int = 0
    interval: int = 0
    gone: int = 0
    digest: bytes = bytes(DIGEST_BYTES)
    last_modified: int = 0
    etag: str = ""
    due: int = 0  # set by the tracker; 0 in a record a worker packs

    def pack(self) -> bytes:
        """The record as the tracker keeps it (``due`` included)."""
        head = _HEAD.pack(
            min(max(self.due, 0), _U32), min(max(self.depth, 0), 0xFF),
            min(max(self.gone, 0), 0xFF), min(max(round(self.interval / 60), 0), _MAX_MINUTES),
            self.digest[:DIGEST_BYTES].ljust(DIGEST_BYTES, b"\0"))
        return head + self._validator()

    def _validator(self) -> bytes:
        etag = self.etag.encode("latin-1", "replace")
        if 2 < len(etag) <= MAX_ETAG + 2 and etag[:1] == b'"' == etag[-1:]:
            return etag[1:-1]  # a strong ETag: the quotes go back when it is sent
        if etag.startswith(b"W/") and len(etag) <= MAX_ETAG:
            return _WEAK + etag
        if self.last_modified > 0:
            return _LAST_MODIFIED + struct.pack(">I", min(self.last_modified, _U32))
        return b""

    def update_hex(self) -> str:
        """What complete.lua takes: the record without its due time, in hex."""
        return self.pack()[4:].hex()

    @classmethod
    def unpack(cls, data: bytes) -> "Record":
        due, depth, gone, minutes, body_digest = _HEAD.unpack_from(data)
        validator = data[_HEAD.size:]
        etag, last_modified = "", 0
        if validator[:1] == _LAST_MODIFIED and len(validator) == 5:
            last_modified = struct.unpack(">I", validator[1:])[0]
        elif validator[:1] == _WEAK:
            etag = validator[1:].decode("latin-1")
        elif validator:
            etag = '"' + validator.decode("latin-1") + '"'
        return cls(depth=depth, interval=minutes * 60, gone=gone, digest=body_digest,
                   last_modified=last_modified, etag=etag, due=due)

    @classmethod
    def from_hex(cls, text: str) -> Optional["Record"]:
        """The record checkout handed out (hex), or None for '' or for a record that is not one
        (anyone who can write to the tracker's Redis could put one there): the page is then
        fetched whole, as a new one is."""
        try:
            return cls.unpack(bytes.fromhex(text)) if text else None
        except (ValueError, struct.error):
            return None


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
