"""Scraping one page: lease it, download it, find its links, report it to the tracker, and pass
it on to its save (a save message now, its save batch, or a save in this process); or, for a
page that asks not to be kept (noindex, or another page named as its canonical URL), mark it
done unsaved.

Each step that ends the page early (the scraper cannot be built, the download or the link
finding fails) hands the item back to the tracker and says how it ended; what the checkout
handed out for scraping is sent in any case.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

from ..backoff import Backoff
from ..context import JobContext
from ..page_rules import SAVE, Verdict
from ..priorities import link_priorities
from ..runtime import Runtime
from ...errors import ConfigError, FetchError, TrackerUnavailable
from ...job.sitemap_spec import ONLY
from ...scrapers import FoundItems, Scraper
from ...tracker import Checkout, Fault, LeaseStatus, ScrapedResult
from ...tracker.revisits import RevisitUpdate
from ...web.fetch import Download, redirect_check
from ...web.fetch_policy import fetch_policy
from ...web.page_meta import NO_META
from ...web.sitemap_items import is_sitemap_item
from . import revisiting
from .failures import Failures, left_for_recovery
from .fetch_rules import FetchRules
from .links import KnownLinks, cap_links
from .publishing import Publisher, dispatch, dispatch_or_keep
from .saving import Saving
from .scraped_saves import ScrapedSave, ScrapedSaves, hand_over, page_holder
from .sitemap_steps import SitemapSteps

log = logging.getLogger(__name__)


class _Ended(Exception):
    """A step ended the page's scrape early (and handed the item back); ``outcome`` says how."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


@dataclass
class LeasedPage:
    """A page this process holds the lease of, as the steps of its scrape pass it on.

    ``unsent``: what the checkout handed out for scraping and is not sent yet; it goes with the
    page's save (emptied when it is handed over), or to the broker when the page ends.
    ``may_wait``: whether what the page itself hands out may wait for its save batch too
    (:meth:`ScrapedSaves.may_wait`). ``go_on``: whether the scrape that holds the page may
    carry on with another item (:meth:`Scraping.scrape`); ``carried``: the item it takes, if
    any."""

    context: JobContext
    item: str
    checkout: Checkout
    unsent: list[str]
    may_wait: bool
    go_on: Optional[Callable[[], bool]] = None
    carried: Optional[str] = None

    @property
    def job(self) -> str:
        return self.context.job

    @property
    def token(self) -> int:
        return self.checkout.token

    def may_carry_on(self) -> bool:
        """Whether the scrape that holds the page may take one more item as the page ends."""
        return self.go_on is not None and self.go_on()

    def carry_on_with(self, handed: Sequence[str]) -> list[str]:
        """Keep the first of ``handed`` (what a carrying tracker call handed out, the carried
        item first) to scrape next; the others, to send."""
        if handed:
            self.carried = handed[0]
        return list(handed[1:])


class Scraping:
    """Scrapes leased pages of any job: the steps of :meth:`scrape`."""

    def __init__(
        self, runtime: Runtime, publisher: Publisher, failures: Failures, known_links: KnownLinks,
        saving: Saving, scraped_saves: Optional[ScrapedSaves],
    ) -> None:
        self.runtime = runtime
        self.publisher = publisher
        self.failures = failures
        self.known_links = known_links
        self.saving = saving
        self.scraped_saves = scraped_saves  # None: each page gets a save message of its own
        self.fetch_rules = FetchRules(runtime.tracker)
        self.sitemap_steps = SitemapSteps(runtime, publisher, failures, self.fetch_rules)
        # By thread: (job, item, since) of the item a scrape carried on to (see carried).
        self._carried: dict[int, tuple[str, str, float]] = {}

    def scrape(self, job: str, item: str, go_on: Optional[Callable[[], bool]] = None) -> str:
        """Lease and download ``item``, queue what it links to, hand it to a save task (or save
        it here, with the ``save_inline`` setting). Returns what happened (for logs and tests).

        With ``go_on``, a page whose fetch ends (scraped, or found unchanged or gone by a
        revisit) takes one more item in the slot it frees, while ``go_on()`` says so (the
        tracker's ``scraped`` or ``complete`` with ``carry``), and this call scrapes it next, and
        so on: the item costs no message, delivery or task run of its own. It is handed out in
        the tracker as a message's would be: if this process dies, it is reclaimed within a
        lease. Returns what happened to ``item``."""
        outcome, carried = self._scrape_one(job, item, go_on)
        if carried is None:
            return outcome
        thread = threading.get_ident()
        try:
            while carried is not None:
                item = carried
                # Held by this process although no task names it: a worker's heartbeat keeps
                # its lease as it keeps a running task's.
                self._carried[thread] = (job, item, time.time())
                try:
                    then, carried = self._scrape_one(job, item, go_on)
                except TrackerUnavailable as exc:
                    left_for_recovery(job, item, exc)
                    break
                except Exception:  # its message's task has ended well; this one is reclaimed
                    log.exception("%s %s: scraping an item carried on to raised", job, item)
                    break
                log.info("%s %s: carried on to: %s", job, item, then)
        finally:
            self._carried.pop(thread, None)
        return outcome

    def carried(self) -> list[tuple[str, str, float]]:
        """(job, item, since: ``time.time()``) of each item a scrape carried on to and is on
        now."""
        return list(self._carried.values())

    def _scrape_one(
        self, job: str, item: str, go_on: Optional[Callable[[], bool]]
    ) -> tuple[str, Optional[str]]:
        """:meth:`scrape` for one item: what happened, and the item to carry on with."""
        runtime = self.runtime
        context = runtime.job_context(job)
        checkout = runtime.tracker.checkout(
            job, item, runtime.worker_id, max_lost=context.spec.max_lost,
            address=self._pacing_address(context, item))
        context = runtime.job_context(job, checkout.created)
        if checkout.status is not LeaseStatus.OK:
            dispatch(self.publisher, job, checkout.dispatch)
            # Done, dead, busy elsewhere, unknown, or throttled (back in its domain's queue until
            # the domain's slot opens): nothing to do here, and this worker's slot is free now.
            return checkout.status.value, None
        page = self._leased_page(context, item, checkout, go_on)
        try:
            # Its robots.txt, sitemaps and the page itself: every request carries what the
            # job's fetch policy asks (headers, credentials, proxies, cookies).
            with fetch_policy(context.fetch_policy):
                return self._scrape_leased(page), page.carried
        except _Ended as ended:
            return ended.outcome, page.carried
        finally:
            if page.unsent:
                dispatch(self.publisher, job, page.unsent)

    @staticmethod
    def _pacing_address(context: JobContext, item: str) -> str:
        """The address ``item``'s fetch will connect to, for a job that paces by address ('' for
        any other): resolved now, once, and kept for the fetch. A scraper or an ID that fails
        here fails again once leased, where its failure is counted."""
        if context.spec.politeness.key != "ip":
            return ""
        try:
            return context.scraper().address_of(item)
        except Exception:
            return ""

    def _leased_page(
        self, context: JobContext, item: str, checkout: Checkout,
        go_on: Optional[Callable[[], bool]],
    ) -> LeasedPage:
        """``item``, just leased, its scrape carrying on while ``go_on()`` says so. With save
        batches, what the checkout handed out for scraping may go to the broker with the page's
        save (one broker round trip a page fewer; see :meth:`ScrapedSaves.may_wait`); at once if
        the page ends otherwise."""
        unsent = list(checkout.dispatch)
        may_wait = self.scraped_saves is not None and self.scraped_saves.may_wait(context)
        if not may_wait:
            unsent = dispatch_or_keep(self.publisher, context.job, item, unsent)
        return LeasedPage(context, item, checkout, unsent, may_wait, go_on)

    def _scrape_leased(self, page: LeasedPage) -> str:
        """:meth:`scrape` once the page is leased. Raises :class:`_Ended` for a page that a
        step ended early."""
        sitemaps = page.context.sitemaps()
        if sitemaps is not None and is_sitemap_item(page.item):
            return self.sitemap_steps.scrape(page.context, sitemaps, page.item, page.checkout)
        scraper = self._scraper(page)
        download = self._download(page, scraper)
        revisit = page.context.spec.revisit
        unchanged = None
        if revisit is not None:
            download, unchanged = revisiting.judge(revisit, page.checkout, download)
            if unchanged is not None:
                if (not self._writes_revisits(page.context)
                        or page.context.page_rules().header_noindex(download)):
                    return self._finish_unsaved(page, unchanged)
                # Its saver records the revisit: saved as any page is, its links (the same as
                # last time) left alone.
                download = dataclasses.replace(download, revisit=unchanged.record_hex,
                                               unchanged=True)
        found, cut, verdict = (([], 0, SAVE) if unchanged is not None
                               else self._links_found(page, scraper, download))
        created = page.checkout.created
        found = self.known_links.unknown(page.job, created, found)
        if verdict.skip:
            return self._finish_skipped(page, found, cut, verdict)
        carry = page.may_carry_on()
        reply = self._report_scraped(page, download, found, cut, carry)
        # Stale or not, the tracker took the finds.
        self.known_links.remember(page.job, created, found)
        if carry and reply.held:
            reply = dataclasses.replace(reply, dispatch=page.carry_on_with(reply.dispatch))
        if not reply.held:
            # Our lease ran out meanwhile and the item went on without us: leave it alone.
            dispatch(self.publisher, page.job, reply.dispatch)
            return "stale"
        if self.scraped_saves is not None:
            return self._join_batch(page, download, reply)
        return self._send_save(page, download, reply)

    @staticmethod
    def _writes_revisits(context: JobContext) -> bool:
        try:
            return context.saver().writes_revisits
        except Exception:  # the page's save meets (and reports) the error
            return False

    def _finish_unsaved(self, page: LeasedPage, update: RevisitUpdate) -> str:
        """The page is done without a save (a revisit found it unchanged, or gone)."""
        carry = page.may_carry_on()
        completed = self.runtime.tracker.complete(page.job, page.item, page.token, update,
                                                  carry=carry)
        items, page.unsent = [*completed.dispatch, *page.unsent], []
        dispatch(self.publisher, page.job, page.carry_on_with(items) if carry else items)
        return update.outcome.value

    def _finish_skipped(self, page: LeasedPage, found: list[str], cut: int, verdict: Verdict) -> str:
        """The page is done without a save, for what it said about itself (``verdict.skip``,
        counted under that name); the links it lets the job follow (``found``, its canonical
        URL among them) are queued first, in the step that puts it under this worker's saving
        lease, as if it were to be saved here."""
        runtime, job = self.runtime, page.job
        if found or cut:
            depth = page.checkout.depth + 1
            reply = runtime.tracker.scraped(
                job, page.item, page.token, found, depth, save_as=runtime.worker_id, cut=cut,
                priorities=self._priorities(page, found, depth))
            self.known_links.remember(job, page.checkout.created, found)
            dispatch(self.publisher, job, reply.dispatch)
            if not reply.held:
                return "stale"
        revisit = page.context.spec.revisit
        update = revisiting.unsaved(revisit, page.checkout) if revisit is not None else None
        completed = runtime.tracker.complete(job, page.item, page.token, update,
                                             skipped=verdict.skip)
        dispatch(self.publisher, job, completed.dispatch)
        return verdict.skip

    def _fail(self, page: LeasedPage, reason: str, **how) -> _Ended:
        """Hand the page's item back for ``reason`` (``how``: as :meth:`Failures.fail` takes
        it): the end of its scrape, to raise."""
        return _Ended(self.failures.fail(page.context, page.item, page.token, reason, **how))

    def _scraper(self, page: LeasedPage) -> Scraper:
        """The job's scraper."""
        try:
            return page.context.scraper()
        except ConfigError as exc:
            # This worker refuses (or cannot load) what the job's spec names, and would for
            # every attempt: dead at once, with the reason.
            raise self._fail(page, str(exc), fault=Fault.ITEM, retryable=False) from None
        except Exception as exc:  # a plug-in failing to build costs an attempt, not the worker
            log.exception("%s %s: building the job's scraper raised", page.job, page.item)
            raise self._fail(page, f"scraper error: {exc!r}", fault=Fault.ITEM) from None

    def _download(self, page: LeasedPage, scraper: Scraper) -> Download:
        """The page, downloaded if the job's robots.txt allows it, its redirects checked."""
        rules, context = self.fetch_rules, page.context
        try:
            url = scraper.url_for(page.item)
            rules.check_robots(context, url)
            sitemaps = context.sitemaps()
            if sitemaps is not None and url is not None:
                self.sitemap_steps.offer(context, sitemaps, url)
            with redirect_check(rules.redirect_check(context)), \
                    revisiting.validators(page.checkout):
                return scraper.download(page.item)
        except FetchError as exc:
            revisit = context.spec.revisit
            if revisit is not None and exc.status in revisiting.GONE_STATUSES:
                raise _Ended(self._finish_unsaved(
                    page, revisiting.gone(revisit, page.checkout))) from None
            # A transient failure waits out its backoff in the tracker, not in a worker or broker.
            delay = Backoff.from_spec(context.spec.politeness).delay(
                page.checkout.failed_attempts, getattr(exc, "retry_after", None)
            ) if exc.retryable else 0.0
            raise self._fail(page, str(exc), fault=Fault.ITEM, retryable=exc.retryable,
                             delay=delay) from None
        except Exception as exc:  # a scraper bug must cost one item, never the worker
            log.exception("%s %s: scraper download raised", page.job, page.item)
            raise self._fail(page, f"download error: {exc!r}", fault=Fault.ITEM) from None

    def _links_found(
        self, page: LeasedPage, scraper: Scraper, download: Download
    ) -> tuple[list[str], int, Verdict]:
        """The items found in the page, capped (:func:`cap_links`), with how many were cut, and
        what becomes of the page by what it says about itself (the job's page rules, read in
        the scraper's parse): none of its links if it says nofollow, its canonical URL first if
        the page is left unsaved for it."""
        scraper_spec = page.context.spec.scraper
        rules = page.context.page_rules()
        # Not when its links would be deeper than the job goes, or the job takes pages from
        # sitemaps alone.
        wanted = ((scraper_spec.max_depth is None or page.checkout.depth < scraper_spec.max_depth)
                  and page.context.spec.sitemaps.mode != ONLY)
        try:
            if wanted:
                found = scraper.find_items(page.item, download)
                meta = found.meta if isinstance(found, FoundItems) else NO_META
            else:
                found = []
                meta = scraper.page_meta(page.item, download) if rules.reads_pages else NO_META
            verdict = rules.judge(page.item, download, meta)
        except Exception as exc:
            log.exception("%s %s: scraper find_items raised", page.job, page.item)
            raise self._fail(page, f"scraper error: {exc!r}", fault=Fault.ITEM) from None
        links, cut = (cap_links(page.job, page.item, found, scraper_spec.max_links_per_page)
                      if verdict.follow else ([], 0))
        if verdict.canonical is not None:
            links = [verdict.canonical, *(link for link in links if link != verdict.canonical)]
        return links, cut, verdict

    def _priorities(self, page: LeasedPage, found: list[str], depth: int) -> list[int]:
        """The priorities of the page's links by the job's rule; [] for breadth-first (all 0)."""
        try:
            rule = page.context.priority_rule()
            return link_priorities(rule, found, depth, page.item) if rule and found else []
        except ConfigError as exc:  # refused or missing here: as for every page, dead at once
            raise self._fail(page, str(exc), fault=Fault.ITEM, retryable=False) from None
        except Exception as exc:  # a plug-in's bug costs an attempt, never the worker
            log.exception("%s %s: the job's priority rule raised", page.job, page.item)
            raise self._fail(page, f"priority rule error: {exc!r}", fault=Fault.ITEM) from None

    def _report_scraped(
        self, page: LeasedPage, download: Download, found: list[str], cut: int, carry: bool
    ) -> ScrapedResult:
        """Tell the tracker the page was scraped, with what it links to; with ``carry``, take
        the item this scrape goes on with (first in the reply's ``dispatch``)."""
        runtime = self.runtime
        depth = page.checkout.depth + 1
        priorities = self._priorities(page, found, depth)
        if runtime.settings.save_inline:
            # Saved in this process (now, or with its batch): the item turns saving under our
            # lease in the same step, and its body, which only a save task on another run would
            # need, is not staged.
            return runtime.tracker.scraped(page.job, page.item, page.token, found, depth,
                                           save_as=runtime.worker_id, cut=cut,
                                           priorities=priorities, carry=carry)
        # Its body is staged in the same step as the item turns save-pending, so a pending
        # save always has a body to take, and a stale lease stages nothing; its save task is
        # queued now, or later with those of other pages.
        return runtime.tracker.scraped(page.job, page.item, page.token, found, depth,
                                       body=download.body, keep_as=page_holder(runtime), cut=cut,
                                       priorities=priorities, carry=carry)

    def _join_batch(self, page: LeasedPage, download: Download, reply: ScrapedResult) -> str:
        """Let the scraped page wait for its save batch, with the scrape messages that may
        wait with it."""
        found, may_wait = list(reply.dispatch), page.may_wait
        if may_wait and found:
            # The tracker handed out items as this page ended: it had room under its
            # dispatch bound with its frontier run dry (a crawl's first levels of links, or
            # its last), or a capped domain has a place again. Either way the broker holds
            # too little to keep the threads busy, and each level of links would wait out
            # the batch's wait.
            found, may_wait = page.unsent + found, False
            page.unsent.clear()
        if not may_wait:
            found = dispatch_or_keep(self.publisher, page.job, page.item, found)
        inline = self.runtime.settings.save_inline
        self.scraped_saves.add(ScrapedSave(page.job, page.item, page.token, download.meta(),
                                           page.unsent + found, download if inline else None))
        page.unsent.clear()
        return "scraped"

    def _send_save(self, page: LeasedPage, download: Download, reply: ScrapedResult) -> str:
        """Publish the page's new scrape messages and its save message (one broker round trip),
        or, with ``save_inline``, the scrape messages and then save it here."""
        runtime, job, token = self.runtime, page.job, page.token
        inline = runtime.settings.save_inline
        try:
            with self.publisher.batch():
                dispatch(self.publisher, job, reply.dispatch)
                if not inline:
                    self.publisher.save(job, page.item, token, download.meta())
        except Exception as exc:
            # Hand the item back now rather than after its save timeout. Scrape messages of the
            # batch that were not sent leave their items dispatched: reclaimed within a lease.
            if not inline:
                runtime.staging.discard(job, token)
            what = "the items found in it" if inline else "the save"
            return self.failures.fail(page.context, page.item, token,
                                      f"could not queue {what}: {exc}", fault=Fault.FREE)
        if inline:
            # If this process dies now, no save message is left to be delivered again: the item
            # is reclaimed (downloaded again) once its saving lease and one more have passed.
            return self.saving.store(page.context, page.item, token, download)
        if page_holder(runtime) is not None:
            hand_over(runtime, job, [(page.item, token)])
        return "scraped"
