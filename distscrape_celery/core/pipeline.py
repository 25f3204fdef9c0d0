"""What happens to one item: lease, download, find new items, stage, save, complete.

Celery-free so it can be tested and reasoned about alone; :mod:`.tasks` wraps it. The rules that
keep data safe: an item is completed only after its saver returned; the items found in a page are
queued before its save can complete it; every failure path either hands the item back to the
tracker under its fencing token or leaves it in flight so that its deadline expires; and every
attempt counts, against ``max_retries`` when the item's download or save raised, against
``max_lost`` when the process holding it vanished.
"""

from __future__ import annotations

import errno
import logging
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import NamedTuple, Optional, Protocol

from .backoff import Backoff
from .batching import Batcher
from ..caches import ByteBoundedCache, text_bytes
from ..errors import ConfigError, FetchError, TrackerUnavailable
from ..web.fetch import Download, redirect_check
from ..tracker.keys import domain_of
from .runtime import Runtime
from ..scrapers import FoundItems
from ..tracker import Checkout, Fault, LeaseStatus, SaveBegin, SaveStart

log = logging.getLogger(__name__)

# A saver failing with one of these cannot store anything right now; the item is not to blame.
_OUTPUT_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_CRAWL_DELAYS_BYTES = 4 * 1024 * 1024  # some 10,000 domains


def _known_link_bytes(key: tuple[str, str, str], _: object) -> int:
    # The job and creation strings are interned, one of each for all the job's entries: an
    # entry costs its link and the tuple.
    return text_bytes(key[2]) + 64


class Publisher(Protocol):
    """Sends tasks to the broker."""

    def scrape(self, job: str, items: Sequence[str]) -> None:
        """Publish one scrape task per item."""

    def save(self, job: str, item: str, token: int, meta: dict, delay: float = 0) -> None:
        """Publish the save task of an item scraped under lease ``token``, to run after ``delay``."""

    def save_batch(self, job: str, saves: Sequence[tuple[str, int, dict]]) -> None:
        """Publish one save task for several scraped items: (item, token, meta) each."""

    def batch(self) -> AbstractContextManager[None]:
        """A block whose publishes may be sent together when it ends (none if it raises); the
        send's error is raised at the end of the block."""


def output_full(exc: BaseException) -> Optional[OSError]:
    """The disk-full error behind ``exc`` (itself or a cause), if there is one."""
    seen: set[int] = set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError) and cur.errno in _OUTPUT_FULL:
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def cap_links(job: str, item: str, found: Sequence[str], cap: int) -> tuple[list[str], int]:
    """``found`` without repeats and cut to its first ``cap`` items (the job's
    max_links_per_page), with how many were cut: those past the cap, and those the scraper
    left out itself when ``found`` is a :class:`FoundItems` (it stopped early, at the cap or
    at its bound on hrefs looked at). A cut page is logged once, naming the limit."""
    distinct = list(dict.fromkeys(found))
    early, limit = (found.cut, found.limit) if isinstance(found, FoundItems) else (0, "")
    cut = early + max(len(distinct) - cap, 0)
    if cut == 0:
        return distinct, 0
    log.warning("%s %s: %d links cut, past the page's %s", job, item, cut,
                limit if early and limit else f"max_links_per_page={cap}")
    return distinct[:cap], cut


def left_for_recovery(job: str, item: str, exc: TrackerUnavailable) -> str:
    """The tracker is down: the item stays in flight there, and once its deadline passes it is
    reclaimed. One line, not a traceback per task, while Redis is down."""
    log.warning("%s %s: left for recovery, the tracker is unavailable: %s", job, item, exc)
    return "tracker-unavailable"


class ScrapedSave(NamedTuple):
    """A scraped item waiting in its worker process for its save batch, with the items found in
    it that the tracker handed out for scraping. ``download``: the page itself, where this
    process saves it (``save_inline``); otherwise its body is staged and a save task takes it."""

    job: str
    item: str
    token: int
    meta: dict
    dispatch: list[str]
    download: Optional[Download] = None


def _by_job(saves: list[ScrapedSave]) -> dict[str, list[ScrapedSave]]:
    by_job: dict[str, list[ScrapedSave]] = {}
    for entry in saves:
        by_job.setdefault(entry.job, []).append(entry)
    return by_job


class _Store(NamedTuple):
    """A downloaded item of a save batch, to be stored: its entry, lease and body."""

    index: int
    item: str
    token: int
    download: Download
    stale: bool


class ItemPipeline:
    def __init__(self, runtime: Runtime, publisher: Publisher) -> None:
        self.rt = runtime
        self.publisher = publisher
        # The Crawl-delay last passed on per (job, domain): one entry per domain crawled, so
        # bounded by bytes; one dropped costs only another pass of the same delay.
        self._crawl_delays: ByteBoundedCache[tuple[str, str], float] = ByteBoundedCache(
            _CRAWL_DELAYS_BYTES, lambda key, delay: text_bytes(*key) + 24
        )
        settings = runtime.settings
        # Links passed to the tracker, per (job, creation, link). The tracker answered for
        # each: it holds it for good, or dropped it past max_pages or max_pages_per_domain,
        # limits that a job's creation never loosens. Sending it again would cost a round of
        # deduplication in Redis for nothing; a link forgotten here is only sent again.
        self._known_links: Optional[ByteBoundedCache[tuple[str, str, str], bool]] = (
            ByteBoundedCache(settings.known_links_bytes, _known_link_bytes)
            if settings.known_links_bytes else None)
        self._saves: Optional[Batcher[ScrapedSave]] = None
        if settings.save_batch_size > 1:
            self._saves = Batcher(
                self._save_here if settings.save_inline else self._queue_saves,
                max_items=settings.save_batch_size, max_wait=settings.save_batch_seconds,
                name="distscrape-saves",
            )

    @property
    def _keeper(self) -> Optional[str]:
        """Who holds a scraped page until its save message is out: this worker, where it must
        (``Runtime.keeps_scraped_pages``), so that the page comes back a lease after the worker
        dies, not a save timeout after; otherwise nobody, and no hand-over follows the message."""
        return self.rt.worker_id if self.rt.keeps_scraped_pages else None

    def flush(self, timeout: float = 30.0) -> bool:
        """Queue the save tasks of every item scraped so far now, or save them here
        (``save_inline``); a worker stopping calls it. True if none is left waiting."""
        return self._saves is None or self._saves.flush(timeout)

    def _dispatch(self, job: str, items: Sequence[str]) -> None:
        if items:
            self.publisher.scrape(job, items)

    def _may_hold(self, job: str) -> bool:
        """Whether the scrape messages a page hands out may wait in this process for its save
        batch (up to ``save_batch_seconds``) instead of going to the broker at once.

        Only where no domain's cap can limit the crawl: a held message counts as in flight, so
        under a cap that the workers could fill, holding it stretches every fetch cycle of the
        domain by the batch's wait. With the default cap (8) the one-site crawl ran at half its
        pages/s on a 50 ms site and at a quarter on loopback (docs/performance.md).
        The cap is compared with the task slots of the live workers. And only where the broker may
        hold more scrape messages than there are slots: with fewer, the held messages would be
        most of what the broker has for the idle slots (the default holds a quarter)."""
        if self._saves is None:
            return False
        tracker = self.rt.tracker
        slots = tracker.worker_slots()
        return (self.rt.spec(job).politeness.smallest_concurrency >= slots
                and tracker.dispatch_bound() > slots)

    def _dispatch_or_keep(self, job: str, item: str, found: list[str]) -> list[str]:
        """Publish ``found`` (handed out while ``item`` was scraped) now; what the broker refused
        is returned, to go with the page's save, or to be sent again when the page ends."""
        if not found:
            return found
        try:
            self._dispatch(job, found)
        except Exception as exc:
            log.warning("%s %s: could not queue %d scrape messages yet, trying again with the "
                        "page's save or when it ends: %s", job, item, len(found), exc)
            return found
        return []

    def _fail(
        self, job: str, item: str, token: int, reason: str, *, fault: Fault, retryable: bool = True,
        delay: float = 0.0,
    ) -> str:
        spec = self.rt.spec(job)
        res = self.rt.tracker.fail(
            job, item, token, reason, fault=fault, max_retries=spec.max_retries,
            max_lost=spec.max_lost, retryable=retryable, delay=delay,
        )
        self._dispatch(job, res.dispatch)
        log.warning("%s %s: %s (%s)", job, item, reason, res.outcome.value)
        return res.outcome.value

    def _check_robots(self, job: str, url: Optional[str]) -> None:
        """Raise :class:`FetchError` if the job's robots.txt policy forbids fetching ``url``;
        else pass the host's Crawl-delay on to the tracker, which paces the domain with it."""
        robots = self.rt.robots(job)
        if robots is None or url is None:
            return
        robots.check(url)
        delay = robots.crawl_delay(url) or 0.0  # at most robots.MAX_CRAWL_DELAY
        domain = domain_of(url)
        if self._crawl_delays.get((job, domain)) != delay:
            # Once per domain and process (again if robots.txt changes): it is the same for all.
            self.rt.tracker.set_domain_delay(job, domain, delay)
            self._crawl_delays.put((job, domain), delay)

    def _redirect_check(self, job: str) -> Optional[Callable[[str], None]]:
        """What a redirect target must pass, in order: the job's host scope (a target outside
        it ends the item, and nothing is fetched there, not even its robots.txt), then the
        job's robots.txt (unless it ignores it). None: nothing to check."""
        scope = self.rt.host_scope(job)
        robots = self.rt.robots(job)
        if scope.takes_any and robots is None:
            return None

        def check(url: str) -> None:
            if not scope.takes(url):
                raise FetchError(
                    f"redirect to {url} leaves the job's hosts (scraper.same_host, "
                    "scraper.allowed_domains)", retryable=False,
                )
            if robots is not None:
                with redirect_check(None):  # fetching the target host's robots.txt checks no hop
                    robots.check(url)

        return check

    def scrape(self, job: str, item: str) -> str:
        """Lease and download ``item``, queue what it links to, hand it to a save task (or save
        it here, with the ``save_inline`` setting). Returns what happened (for logs and tests)."""
        tracker = self.rt.tracker
        spec = self.rt.spec(job)
        co = tracker.checkout(job, item, self.rt.worker_id, max_lost=spec.max_lost)
        self.rt.follow_job(job, co.created)
        if co.status is not LeaseStatus.OK:
            self._dispatch(job, co.dispatch)
            # Done, dead, busy elsewhere, unknown, or throttled (back in its domain's queue until
            # the domain's slot opens): nothing to do here, and this worker's slot is free now.
            return co.status.value
        # With save batches, what the checkout handed out for scraping may go to the broker with
        # the page's save (one broker round trip a page fewer; see _may_hold); at once if the
        # page ends otherwise.
        carry = list(co.dispatch)
        hold = self._may_hold(job)
        if not hold:
            carry = self._dispatch_or_keep(job, item, carry)
        try:
            return self._scrape_leased(job, item, co, carry, hold)
        finally:
            if carry:
                self._dispatch(job, carry)

    def _scrape_leased(
        self, job: str, item: str, co: Checkout, carry: list[str], hold: bool
    ) -> str:
        """:meth:`scrape` once ``item`` is leased; ``carry`` is what to dispatch with its save
        (emptied when it is handed over), ``hold`` whether what the page hands out may wait for
        its save batch too (:meth:`_may_hold`)."""
        tracker = self.rt.tracker
        spec = self.rt.spec(job)
        token = co.token
        try:
            scraper = self.rt.scraper(job)
        except ConfigError as exc:
            # This worker refuses (or cannot load) what the job's spec names, and would for
            # every attempt: dead at once, with the reason.
            return self._fail(job, item, token, str(exc), fault=Fault.ITEM, retryable=False)
        except Exception as exc:  # a plug-in failing to build costs an attempt, not the worker
            log.exception("%s %s: building the job's scraper raised", job, item)
            return self._fail(job, item, token, f"scraper error: {exc!r}", fault=Fault.ITEM)
        try:
            self._check_robots(job, scraper.url_for(item))
            with redirect_check(self._redirect_check(job)):
                download = scraper.download(item)
        except FetchError as exc:
            # A transient failure waits out its backoff in the tracker, not in a worker or broker.
            delay = Backoff.from_spec(spec.politeness).delay(
                co.failed_attempts, getattr(exc, "retry_after", None)
            ) if exc.retryable else 0.0
            return self._fail(
                job, item, token, str(exc), fault=Fault.ITEM, retryable=exc.retryable, delay=delay
            )
        except Exception as exc:  # a scraper bug must cost one item, never the worker
            log.exception("%s %s: scraper download raised", job, item)
            return self._fail(job, item, token, f"download error: {exc!r}", fault=Fault.ITEM)
        max_depth = spec.scraper.max_depth
        cut = 0
        if max_depth is not None and co.depth >= max_depth:
            found: list[str] = []  # its links would be deeper than the job goes
        else:
            try:
                found = scraper.find_items(item, download)
            except Exception as exc:
                log.exception("%s %s: scraper find_items raised", job, item)
                return self._fail(job, item, token, f"scraper error: {exc!r}", fault=Fault.ITEM)
            found, cut = cap_links(job, item, found, spec.scraper.max_links_per_page)
        found = self._unknown_links(job, co.created, found)
        inline = self.rt.settings.save_inline
        if inline:
            # Saved in this process (now, or with its batch): the item turns saving under our
            # lease in the same step, and its body, which only a save task on another run would
            # need, is not staged.
            res = tracker.scraped(job, item, token, found, co.depth + 1, save_as=self.rt.worker_id,
                                  cut=cut)
        else:
            # Its body is staged in the same step as the item turns save-pending, so a pending
            # save always has a body to take, and a stale lease stages nothing; its save task is
            # queued now, or later with those of other pages.
            res = tracker.scraped(job, item, token, found, co.depth + 1, body=download.body,
                                  keep_as=self._keeper, cut=cut)
        # Stale or not, the tracker took the finds.
        self._remember_links(job, co.created, found)
        if not res.held:
            # Our lease ran out meanwhile and the item went on without us: leave it alone.
            self._dispatch(job, res.dispatch)
            return "stale"
        if self._saves is not None:
            found = list(res.dispatch)
            if hold and found:
                # The tracker handed out items as this page ended: it had room under its
                # dispatch bound with its frontier run dry (a crawl's first levels of links, or
                # its last), or a capped domain has a place again. Either way the broker holds
                # too little to keep the threads busy, and each level of links would wait out
                # the batch's wait.
                found, hold = carry + found, False
                carry.clear()
            if not hold:
                found = self._dispatch_or_keep(job, item, found)
            self._saves.add(ScrapedSave(job, item, token, download.meta(), carry + found,
                                        download if inline else None))
            carry.clear()
            return "scraped"
        try:
            # The page's new scrape messages and its save message: one broker round trip.
            with self.publisher.batch():
                self._dispatch(job, res.dispatch)
                if not inline:
                    self.publisher.save(job, item, token, download.meta())
        except Exception as exc:
            # Hand the item back now rather than after its save timeout. Scrape messages of the
            # batch that were not sent leave their items dispatched: reclaimed within a lease.
            if not inline:
                self.rt.staging.discard(job, token)
            what = "the items found in it" if inline else "the save"
            return self._fail(job, item, token, f"could not queue {what}: {exc}", fault=Fault.FREE)
        if inline:
            # If this process dies now, no save message is left to be delivered again: the item
            # is reclaimed (downloaded again) once its saving lease and one more have passed.
            return self._store(job, item, token, download)
        if self._keeper is not None:
            self._hand_over(job, [(item, token)])
        return "scraped"

    def _links_of(self, job: str, created: str) -> Optional[tuple[str, str]]:
        """The first two parts of the keys of ``job``'s known links (interned: one copy for
        all its entries); None if nothing is remembered (none kept, or no creation named)."""
        if self._known_links is None or not created:
            return None
        return sys.intern(job), sys.intern(created)

    def _unknown_links(self, job: str, created: str, found: list[str]) -> list[str]:
        """``found`` without the links this process passed to the tracker already for this
        creation of ``job``."""
        of = self._links_of(job, created)
        if of is None or not found:
            return found
        get = self._known_links.get
        return [link for link in found if get((*of, link)) is None]

    def _remember_links(self, job: str, created: str, sent: list[str]) -> None:
        """The tracker answered a call that passed it ``sent``."""
        of = self._links_of(job, created)
        if of is not None:
            for link in sent:
                self._known_links.put((*of, link), True)

    def _queue_saves(self, saves: list[ScrapedSave]) -> None:
        """Publish one save task per job for ``saves``, with the scrape messages of the items
        found in them: one broker round trip. What cannot be published is handed back."""
        for job, group in _by_job(saves).items():
            try:
                with self.publisher.batch():
                    self._dispatch(job, [x for entry in group for x in entry.dispatch])
                    self.publisher.save_batch(job, [(e.item, e.token, e.meta) for e in group])
            except Exception as exc:
                # Handed back now rather than a lease later. Scrape messages that were not sent
                # leave their items dispatched: reclaimed within a lease.
                for entry in group:
                    try:
                        self.rt.staging.discard(job, entry.token)
                        self._fail(job, entry.item, entry.token, f"could not queue the save: {exc}",
                                   fault=Fault.FREE)
                    except Exception as again:  # the tracker reclaims it within a lease
                        log.warning("%s %s: left for recovery: %s", job, entry.item, again)
                continue
            if self._keeper is not None:
                self._hand_over(job, [(e.item, e.token) for e in group])

    def _save_here(self, saves: list[ScrapedSave]) -> None:
        """Save ``saves``, scraped by this process and held under its saving leases, as
        :meth:`save_batch` saves a batch it has begun, one group per job, and publish the scrape
        messages that waited with them: a save batch with no save task (``save_inline``)."""
        for job, group in _by_job(saves).items():
            stores = [_Store(i, e.item, e.token, e.download, False) for i, e in enumerate(group)]
            results: list[Optional[str]] = [None] * len(stores)
            try:
                with self.publisher.batch():
                    self._dispatch(job, [x for entry in group for x in entry.dispatch])
                    self._store_all(job, stores, results, together=True)
            except Exception as exc:
                # Not saved, or saved with what they handed out unsent: either way the tracker
                # reclaims what is left in flight within a lease.
                log.warning("%s: %d saves ended early (%d saved): %s", job, len(group),
                            results.count("saved"), exc)

    def _hand_over(self, job: str, saves: list[tuple[str, int]]) -> None:
        """Give the items of save messages just queued (item, token) the save timeout: from
        now on the broker holds them, not this worker's lease."""
        try:
            self.rt.tracker.handoff(job, self.rt.worker_id, saves)
        except Exception as exc:
            # The messages are out: each save runs, and if it waits longer than a lease its
            # item is downloaded again meanwhile, which the late save's complete settles.
            log.warning("%s: could not hand over %d queued saves: %s", job, len(saves), exc)

    def save_batch(self, job: str, saves: Sequence[tuple[str, int, dict]]) -> list[str]:
        """Save several scraped items, each as :meth:`save` would, with one tracker round trip to
        begin them all; returns what happened to each.

        With a saver that commits groups (:meth:`ItemSaver.commits_groups`: the file saver makes
        them durable with two disk flushes, not two per item), the bodies go to it together and
        the items are marked done together once all are stored. Otherwise, and for a batch of
        which an item was interrupted before (its holder vanished, ``lost``), each item is saved
        and marked done in turn, so that a save that kills its process costs the items before it
        no second write."""
        entries = [(item, int(token), meta) for item, token, meta in saves]
        spec = self.rt.spec(job)
        try:
            begins = self.rt.tracker.begin_saves(
                job, [(item, token) for item, token, _ in entries], self.rt.worker_id,
                max_lost=spec.max_lost,
            )
        except TrackerUnavailable as exc:
            # Left in flight: the tracker reclaims them (the worker's heartbeat keeps them until
            # the batch is over, then a lease).
            log.warning("%s: %d saves left for recovery, the tracker is unavailable: %s",
                        job, len(entries), exc)
            return ["tracker-unavailable"] * len(entries)
        if begins:
            self.rt.follow_job(job, begins[0].created)
        results: list[Optional[str]] = [None] * len(entries)
        try:
            # What beginning and completing hand out for scraping goes to the broker together,
            # at the end.
            with self.publisher.batch():
                stores: list[_Store] = []
                for i, ((item, token, meta), begin) in enumerate(zip(entries, begins)):
                    try:
                        outcome = self._begun(job, item, token, meta, begin)
                    except TrackerUnavailable as exc:
                        outcome = left_for_recovery(job, item, exc)
                    if isinstance(outcome, str):
                        results[i] = outcome
                    else:
                        stores.append(_Store(i, item, token, outcome, begin.status is SaveStart.STALE))
                self._store_all(job, stores, results,
                                together=not any(begin.lost for begin in begins))
        except Exception as exc:
            if None in results:  # not the batch's send at the end
                raise
            # Every item is saved or handed back; what the tracker handed out for scraping meanwhile
            # (and a save to look at again later) was not queued: reclaimed within a lease.
            log.warning("%s: could not queue what %d saves handed out: %s", job, len(entries), exc)
        return results  # type: ignore[return-value]

    def _store_all(
        self, job: str, stores: list[_Store], results: list[Optional[str]], *, together: bool
    ) -> None:
        """Store ``stores``: as one group where ``together`` allows and the job's saver commits
        groups, else each alone; each result goes to ``results`` at its entry's index."""
        if together and len(stores) > 1 and self._commits_groups(job):
            self._store_together(job, stores, results)
            return
        for store in stores:
            try:
                results[store.index] = self._store(
                    job, store.item, store.token, store.download, stale=store.stale)
            except TrackerUnavailable as exc:
                results[store.index] = left_for_recovery(job, store.item, exc)

    def _commits_groups(self, job: str) -> bool:
        """Whether the job's saver commits groups; False if it cannot be built, so that each
        item's own save meets (and reports) the error."""
        try:
            return self.rt.saver(job).commits_groups()
        except Exception:
            return False

    def _store_together(self, job: str, stores: list[_Store], results: list[Optional[str]]) -> None:
        """Hand ``stores`` to the saver as one group, then mark the stored ones done in one
        tracker round trip; each result goes to ``results`` at its entry's index."""
        saver = self.rt.saver(job)
        try:
            outcomes = saver.save_many([(s.item, s.download) for s in stores])
            if len(outcomes) != len(stores):
                raise RuntimeError(f"save_many returned {len(outcomes)} results for {len(stores)} items")
        except Exception as exc:  # a saver bug: as if each save had raised it
            outcomes = [exc] * len(stores)
        stored = []
        for store, outcome in zip(stores, outcomes):
            if isinstance(outcome, BaseException):
                try:
                    results[store.index] = self._store_failed(
                        job, store.item, store.token, store.download, outcome, stale=store.stale)
                except TrackerUnavailable as exc:
                    results[store.index] = left_for_recovery(job, store.item, exc)
            else:
                stored.append(store)
        if not stored:
            return
        try:
            # The staged bodies are dropped in the same step.
            done = self.rt.tracker.complete_many(job, [(s.item, s.token) for s in stored])
        except TrackerUnavailable as exc:
            for store in stored:  # saved; saved again once the tracker reclaims them
                results[store.index] = left_for_recovery(job, store.item, exc)
            return
        for store, res in zip(stored, done):
            self._dispatch(job, res.dispatch)
            results[store.index] = "saved" if res.changed else "saved-again"

    def save(self, job: str, item: str, token: int, meta: dict) -> str:
        """Save a scraped item through the job's saver, then mark it done."""
        spec = self.rt.spec(job)
        begin = self.rt.tracker.begin_save(job, item, token, self.rt.worker_id, max_lost=spec.max_lost)
        self.rt.follow_job(job, begin.created)
        outcome = self._begun(job, item, token, meta, begin)
        if isinstance(outcome, str):
            return outcome
        return self._store(job, item, token, outcome, stale=begin.status is SaveStart.STALE)

    def _begun(
        self, job: str, item: str, token: int, meta: dict, begin: SaveBegin
    ) -> "str | Download":
        """What to do once ``begin_save`` answered: the download to store, or what happened
        instead (skipped, busy, stale, failed). Raises TrackerUnavailable."""
        staging = self.rt.staging
        self._dispatch(job, begin.dispatch)
        if begin.status in (SaveStart.DONE, SaveStart.DEAD, SaveStart.UNKNOWN):
            staging.discard(job, token)
            if begin.status is SaveStart.DEAD:
                log.warning("%s %s: given up on before its save (lost %d times)", job, item, begin.lost)
            return f"save-skipped-{begin.status.value}"
        if begin.status is SaveStart.BUSY:
            # Another run of this very save holds a live lease: a duplicate delivery, or the
            # redelivery of a run whose process just died and whose lease has not run out yet.
            # Look again soon: by then it is done, or back to waiting for its save.
            self.publisher.save(job, item, token, meta, delay=self.rt.settings.heartbeat_interval)
            return "save-busy"
        stale = begin.status is SaveStart.STALE
        if begin.lost and not stale:
            log.warning(
                "%s %s: saving again; the worker holding it vanished %d time(s) so far",
                job, item, begin.lost,
            )
        body = begin.body
        if body is None:
            if stale:
                return "stale"
            return self._fail(
                job, item, token,
                "its staged body was gone when the save ran (it waited longer than the body's "
                "TTL, or Redis lost it); it will be downloaded again",
                fault=Fault.LOST,
            )
        return Download.from_meta(meta, body)

    def _store(self, job: str, item: str, token: int, download: Download, *, stale: bool = False) -> str:
        """Hand ``download`` to the job's saver under lease ``token``, then mark the item done."""
        try:
            self.rt.saver(job).save(item, download)
        except Exception as exc:
            return self._store_failed(job, item, token, download, exc, stale=stale)
        res = self.rt.tracker.complete(job, item, token)  # drops the staged body too
        self._dispatch(job, res.dispatch)
        return "saved" if res.changed else "saved-again"

    def _store_failed(
        self, job: str, item: str, token: int, download: Download, exc: BaseException, *, stale: bool
    ) -> str:
        """The saver raised ``exc`` for ``item``: retry later, defer, or ignore (stale)."""
        if stale:  # the live holder saves it; a late failure changes nothing
            return "stale"
        full = output_full(exc)
        if full is not None:
            return self._defer(job, item, token, download, full)
        if isinstance(exc, ConfigError):
            # The worker refuses the job's saver or its output (or cannot build it): every
            # attempt would fail the same way.
            log.error("%s %s: save refused: %s", job, item, exc)
            return self._fail(job, item, token, str(exc), fault=Fault.ITEM, retryable=False)
        log.error("%s %s: save failed", job, item, exc_info=exc)
        return self._fail(job, item, token, f"save failed: {exc}", fault=Fault.ITEM)

    def _defer(self, job: str, item: str, token: int, download: Download, error: OSError) -> str:
        """The output is full: keep the item and its body, and try the save again later."""
        if not self.rt.tracker.defer_save(job, item, token):
            return "stale"
        # Staged afresh, not only kept alive: an inline save had staged nothing.
        self.rt.staging.stage(job, token, download.body)
        delay = self.rt.settings.save_retry_delay
        log.error(
            "%s %s: cannot save, the output is full (%s); the item is kept and its save retried "
            "in %.0f s", job, item, error, delay,
        )
        self.publisher.save(job, item, token, download.meta(), delay=delay)
        return "deferred"
