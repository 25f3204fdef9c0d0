"""Revisits: what a job that revisits asks of a known page's server, and what it makes of the
answer. A page is *unchanged* if its server answers 304 to the validators the job kept, or
sends a body with the digest the job kept: it is not saved again, and its links (the same as
last time) are not looked at. A 404 or 410 makes it *gone*: not retried, counted, and forgotten
after the job's ``drop_gone_after`` generations in a row. Anything else is saved as a new page
is, with the record the tracker keeps once it is saved."""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager, nullcontext
from typing import Optional

from ...job.revisit_spec import RevisitSpec
from ...tracker import Checkout
from ...tracker.revisits import Record, RevisitOutcome, RevisitUpdate, digest
from ...web.fetch import Download, conditional

# The statuses that say a page is no more.
GONE_STATUSES = frozenset({404, 410})


def validators(checkout: Checkout) -> AbstractContextManager:
    """The block in which the page of ``checkout`` is fetched: conditional on the copy the job
    has, if it has one."""
    record = checkout.record
    if record is None or not (record.etag or record.last_modified):
        return nullcontext()
    return conditional(record.etag, record.last_modified or None)


def judge(spec: RevisitSpec, checkout: Checkout, download: Download
          ) -> tuple[Download, Optional[RevisitUpdate]]:
    """The page as it is to be saved (with the record its save hands the tracker), and None; or,
    for an unchanged page, the download and the update that completes it unsaved."""
    old = checkout.record
    body_digest = digest(download.body)
    if old is not None and (download.not_modified or body_digest == old.digest):
        kept = Record(
            depth=checkout.depth, interval=spec.next_interval(old.interval, changed=False),
            digest=old.digest, etag=download.etag or old.etag,
            last_modified=int(download.last_modified or old.last_modified))
        return download, RevisitUpdate.of(RevisitOutcome.UNCHANGED, kept)
    record = Record(
        depth=checkout.depth,
        interval=spec.next_interval(old.interval if old is not None else None, changed=True),
        digest=body_digest, etag=download.etag, last_modified=int(download.last_modified or 0))
    return dataclasses.replace(download, revisit=record.update_hex()), None


def unsaved(spec: RevisitSpec, checkout: Checkout) -> RevisitUpdate:
    """The update of a page fetched and left unsaved for what it said (noindex, a canonical URL
    elsewhere): known, due again by its interval, with no digest or validators, so that its
    next revisit fetches it whole and judges it again (never "unchanged": no copy of it was
    kept to be unchanged from)."""
    old = checkout.record
    return RevisitUpdate.of(RevisitOutcome.SAVED, Record(
        depth=checkout.depth,
        interval=spec.next_interval(old.interval if old is not None else None, changed=True)))


def gone(spec: RevisitSpec, checkout: Checkout) -> RevisitUpdate:
    """The update of a page found gone: kept (to be asked again in its next due generation)
    until it has been gone ``drop_gone_after`` times in a row, then dropped."""
    old = checkout.record or Record(depth=checkout.depth)
    times = old.gone + 1
    if times >= spec.drop_gone_after:
        return RevisitUpdate.of(RevisitOutcome.DROPPED)
    return RevisitUpdate.of(RevisitOutcome.GONE, dataclasses.replace(
        old, depth=checkout.depth, gone=times, due=0,
        interval=spec.next_interval(old.interval if checkout.record else None, changed=True)))
