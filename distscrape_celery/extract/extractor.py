"""A job's extractor: the records of each saved page, from its selectors, its structured data
and its own function, each record bounded in size and a page's in number."""

from __future__ import annotations

import json
import logging
from typing import Optional

from ..job.extract_spec import ExtractSpec
from ..job.patterns import Budget
from ..redaction import escape
from ..web.fetch import Download
from .page import Page
from .plugin import ExtractFunction, PluginRecords
from .selectors import SelectorRecords
from .structured import StructuredData

log = logging.getLogger(__name__)


class Extractor:
    """Turns a job's saved pages into records, as its ``[extract]`` says: the selectors' records
    (a page's one record holds its structured data too), then the function's. Each record is a
    dict of JSON values that starts with the page's ``url``, ``status``, ``fetched_at`` (ISO
    8601, UTC) and ``job``; a field cannot replace those. Built once per job and process; threads
    may share it.

    Whatever a page holds costs at most its own records: a page that breaks a selector, the
    function or its regex time budget (``regex_seconds``) gives none, and is logged. Past
    ``max_records`` a page's records are dropped, and so is a record larger than
    ``max_record_bytes`` as JSON, or one that is not JSON."""

    def __init__(self, spec: ExtractSpec, job: str, *, function: Optional[ExtractFunction] = None,
                 regex_seconds: float = 2.0) -> None:
        if (function is None) != (spec.function is None):
            raise ValueError("the function the spec names must be given, loaded, and only then")
        self.spec = spec
        self.job = job
        self.regex_seconds = regex_seconds
        self._selectors = SelectorRecords(spec)
        self._structured = StructuredData(spec.structured) if spec.structured else None
        self._plugin = PluginRecords(function, spec.function) if function is not None else None

    def records(self, download: Download) -> tuple[dict, ...]:
        """The records of the saved page ``download``; () when it yields none or breaks."""
        page = Page(download, self.job)
        try:
            found = self._found(page)
        except Exception as exc:
            log.warning("%s %s: no records from this page: %s: %s", self.job,
                        escape(page.url), type(exc).__name__, escape(str(exc)[:500]))
            return ()
        return tuple(self._bounded(page, found))

    def _found(self, page: Page) -> list[dict]:
        limit = self.spec.max_records
        found: list[dict] = []
        if self.spec.fields or self._structured is not None:
            budget = Budget(self.regex_seconds)
            found = self._selectors.records(page.selector, budget, limit)
            if self._structured is not None:
                structured = self._structured.fields(page.selector, page.url)
                found = [{**record, **structured} for record in found] or [structured]
        if self._plugin is not None and len(found) < limit:
            found += self._plugin.records(page, limit - len(found))
        return found

    def _bounded(self, page: Page, found: list[dict]) -> list[dict]:
        """``found`` with the page's keys, without the records that are too large or not JSON."""
        keys = page.keys()
        kept: list[dict] = []
        dropped: list[str] = []
        for fields in found[: self.spec.max_records]:
            record = {**keys, **{k: v for k, v in fields.items() if k not in keys}}
            try:
                size = len(json.dumps(record, ensure_ascii=False, allow_nan=False).encode())
            except (TypeError, ValueError) as exc:
                dropped.append(f"not JSON ({exc})")
                continue
            if size > self.spec.max_record_bytes:
                dropped.append(f"{size} bytes, more than max_record_bytes")
                continue
            kept.append(record)
        if len(found) > self.spec.max_records:
            dropped.append(f"{len(found) - self.spec.max_records} past max_records")
        if dropped:
            log.warning("%s %s: %d record(s) dropped: %s", self.job, escape(page.url),
                        len(dropped), escape("; ".join(dropped[:5])[:500]))
        return kept
