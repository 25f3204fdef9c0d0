"""A completion that carries on (``complete(..., carry=True)``) on both trackers: the caller
gets one more item in the slot it frees, past the dispatch bound, and the domain's politeness
holds for it as for any other."""

from __future__ import annotations

from distscrape_celery.tracker import CrawlLimits, DomainLimits, LeaseStatus
from tests.support.jobs import new_job


def _broker_full(tracker):
    """A job of 30 items on as many domains, as many of them handed out as the broker may hold,
    and the first of those leased (its slot in the broker filled again): its worker, the items,
    those handed out and the first lease."""
    worker = new_job(tracker, limits=CrawlLimits(default=DomainLimits(concurrency=64)))
    items = [f"http://h{i}.test/" for i in range(30)]
    handed = list(tracker.add("j", items).dispatch)
    assert len(handed) == tracker.dispatch_bound() < len(items)
    first = tracker.checkout("j", handed[0], worker, max_lost=3)
    handed += first.dispatch
    return worker, items, handed, first


def test_a_carrying_completion_gets_one_item_past_the_bound(tracker_factory):
    tracker = tracker_factory()
    worker, items, handed, first = _broker_full(tracker)
    # The broker holds as many as it may: a plain completion hands out nothing.
    assert tracker.complete("j", handed[0], first.token).dispatch == []
    second = tracker.checkout("j", handed[1], worker, max_lost=3)
    handed += second.dispatch
    carried = tracker.complete("j", handed[1], second.token, carry=True).dispatch
    assert len(carried) == 1 and carried[0] in items and carried[0] not in handed
    assert tracker.stats("j").dispatched == len(handed) - 2 + 1
    taken = tracker.checkout("j", carried[0], worker, max_lost=3)
    assert taken.status is LeaseStatus.OK


def test_a_carried_item_keeps_its_domains_politeness(tracker_factory):
    tracker = tracker_factory()
    # One fetch start a minute on the one domain: its next turn is far off.
    worker = new_job(tracker, limits=CrawlLimits(default=DomainLimits(interval=60)))
    items = [f"http://a.test/{i}" for i in range(5)]
    handed = tracker.add("j", items).dispatch
    assert len(handed) == 1
    c = tracker.checkout("j", handed[0], worker, max_lost=3)
    assert tracker.complete("j", handed[0], c.token, carry=True).dispatch == []
    # One in flight a domain: a carried item is never a second one in flight on its domain,
    # even with the broker full (so that only the carry hands anything out).
    tracker = tracker_factory()
    worker = new_job(tracker, "k", limits=CrawlLimits(default=DomainLimits(concurrency=1)))
    handed = list(tracker.add("k", items).dispatch)
    assert handed == [items[0]]
    handed += tracker.add("k", [f"http://h{i}.test/" for i in range(30)]).dispatch
    assert len(handed) == tracker.dispatch_bound()
    c = tracker.checkout("k", items[0], worker, max_lost=3)
    handed += c.dispatch
    # a.test has one in flight: whatever is carried comes from another domain.
    others = tracker.complete("k", handed[1], tracker.checkout(
        "k", handed[1], worker, max_lost=3).token, carry=True).dispatch
    assert len(others) == 1 and not others[0].startswith("http://a.test/")
    carried = tracker.complete("k", items[0], c.token, carry=True).dispatch
    assert len(carried) == 1 and carried[0] not in handed + others


def test_a_carrying_scrape_report_gets_one_item_past_the_bound(tracker_factory):
    tracker = tracker_factory()
    worker, items, handed, first = _broker_full(tracker)
    # The broker holds as many as it may: a plain report hands out nothing.
    assert tracker.scraped("j", handed[0], first.token, save_as=worker).dispatch == []
    second = tracker.checkout("j", handed[1], worker, max_lost=3)
    handed += second.dispatch
    reply = tracker.scraped("j", handed[1], second.token, ["http://new.test/"], 1,
                            save_as=worker, carry=True)
    assert reply.held and reply.added == 1
    assert len(reply.dispatch) == 1 and reply.dispatch[0] not in handed
    assert tracker.stats("j").dispatched == len(handed) - 2 + 1
    assert tracker.checkout("j", reply.dispatch[0], worker, max_lost=3).status is LeaseStatus.OK


def test_a_stale_or_throttled_scrape_report_carries_nothing(tracker_factory):
    tracker = tracker_factory()
    worker, _, handed, c = _broker_full(tracker)
    # A holder whose lease went on without it gets nothing to go on with.
    stale = tracker.scraped("j", handed[0], c.token + 1, save_as=worker, carry=True)
    assert not stale.held and stale.dispatch == []
    # One fetch start a minute on the one domain: its next turn is far off.
    worker = new_job(tracker, "k", limits=CrawlLimits(default=DomainLimits(interval=60)))
    paced = [f"http://a.test/{i}" for i in range(5)]
    handed = tracker.add("k", paced).dispatch
    assert len(handed) == 1
    c = tracker.checkout("k", handed[0], worker, max_lost=3)
    reply = tracker.scraped("k", handed[0], c.token, save_as=worker, carry=True)
    assert reply.held and reply.dispatch == []
