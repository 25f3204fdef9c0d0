"""A worker process gathers the saves of the pages it scraped into one save task.

The pipeline against a real Redis tracker and real HTTP (no Celery); the crash cases, with real
worker processes, are in test_save_faults.py (the worker killed before its batch is queued).
"""

from __future__ import annotations

import threading
import time
import weakref

import pytest

from distscrape_celery.worker.agent import reserved_items
from distscrape_celery.core.batching import Batcher
from distscrape_celery.worker.names import SAVE_BATCH_TASK, SAVE_TASK, SCRAPE_TASK
from distscrape_celery.tracker.keys import JobKeys
from distscrape_celery.tracker import LeaseStatus
from tests.support.pipeline import ROUTES, pipeline_env


def wait_for(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- the batcher ------------------------------------------------------------------------------


def test_batcher_sends_a_full_group_at_once_and_the_rest_when_the_oldest_waited():
    groups, sent_at = [], []

    def flush(group):
        groups.append(group)
        sent_at.append(time.monotonic())

    b = Batcher(flush, max_items=3, max_wait=0.3, name="t")
    start = time.monotonic()
    for n in range(4):
        b.add(n)
    wait_for(lambda: len(groups) == 1)
    assert groups[0] == [0, 1, 2] and sent_at[0] - start < 0.2  # full: not waiting out max_wait
    wait_for(lambda: len(groups) == 2)
    assert groups[1] == [3] and sent_at[1] - start >= 0.25
    assert b.pending() == 0
    assert b.close()


def test_batcher_flush_sends_now_and_a_failing_flush_does_not_stop_it(caplog):
    groups = []

    def flush(group):
        if group == ["bad"]:
            raise RuntimeError("broker gone")
        groups.append(group)

    b = Batcher(flush, max_items=100, max_wait=60, name="t")
    b.add("bad")
    assert b.flush(timeout=5)  # long before max_wait
    assert "could not pass on 1 entries" in caplog.text
    b.add("a")
    b.add("b")
    assert b.flush(timeout=5)
    assert groups == [["a", "b"]]
    b.close()
    with pytest.raises(RuntimeError, match="closed"):
        b.add("late")


def test_batcher_holds_back_adders_while_the_broker_is_stuck():
    """A flush that hangs must not let entries pile up without bound."""
    release = threading.Event()
    b = Batcher(lambda group: release.wait(10), max_items=2, max_wait=0, name="t")
    added = []

    def adder():
        for n in range(20):
            b.add(n)
            added.append(n)

    t = threading.Thread(target=adder, daemon=True)
    t.start()
    time.sleep(0.3)
    assert len(added) <= 2 + 4 * 2  # one group being sent, four waiting
    release.set()
    t.join(5)
    assert added == list(range(20))
    assert b.close()


# -- the pipeline -----------------------------------------------------------------------------


@pytest.fixture
def batch_env(redis_url, server, tmp_path):  # noqa: F811
    return pipeline_env(redis_url, server, tmp_path, save_batch_size=8, save_batch_seconds=5)


# A broker whose queue a worker cannot read: a scraped page is then kept under its worker's lease
# until its save message is out (the pipeline publishes through a recorder here, not to it).
AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def owner(rt, item):
    return rt.tracker.client.hget(JobKeys("p").owners, item)


def test_saves_wait_for_their_batch_with_no_holder_where_lost_saves_are_found(batch_env, tmp_path):
    """With the Redis broker a live worker finds a page whose worker died before it sent the
    page's save (lost_saves.py): the page waits for its save message with no holder from the
    start, and no hand-over call follows the message."""
    rt, pipe, rec, server = batch_env
    assert rt.finds_lost_saves
    items = [server.base + "/ok", server.base + "/hostile"]
    rt.tracker.add("p", items)
    for item in items:
        assert pipe.scrape("p", item) == "scraped"
    assert rec.batches == []  # waiting in the process: no save queued yet
    assert all(owner(rt, item).startswith("- ") for item in items)
    assert all(_pending_for(rt, item) > 60 for item in items)  # the save timeout, not a lease
    assert rt.tracker.checkout("p", items[0], "w2", max_lost=3).status is LeaseStatus.BUSY
    assert rec.scrapes == [server.base + "/ok2"]  # found in both, queued once, sent at once
    handoffs = []
    rt.tracker.handoff = lambda *args: handoffs.append(args) or 0
    assert pipe.flush()
    assert handoffs == []
    [batch] = rec.batches
    assert [item for item, _, _ in batch] == items
    assert pipe.save_batch("p", batch) == ["saved", "saved"]
    assert rt.tracker.stats("p").done == 2
    assert list(rt.tracker.client.scan_iter(JobKeys("p").prefix + "body:*")) == []
    saved = sorted(p.read_bytes() for p in (tmp_path / "out").rglob("*.html"))
    assert saved == sorted([ROUTES["/ok"][1], ROUTES["/hostile"][1]])


def test_a_page_whose_batch_never_went_out_is_found_and_downloaded_again(batch_env):
    """The worker died with the page's save gathered and not sent: a live worker's check of the
    broker's save queue finds the page missing and has it reclaimed."""
    from distscrape_celery.worker.lost_saves import LostSaves

    rt, pipe, rec, server = batch_env
    item = server.base + "/ok"
    rt.tracker.add("p", [item])
    assert pipe.scrape("p", item) == "scraped"
    broker = rt.tracker.client
    finder = LostSaves(rt.tracker, broker, rt.settings.save_queue, age=0)
    assert [finder.check("p") for _ in range(3)] == [0, 0, 1]
    assert rt.tracker.maintain("p", max_lost=3).reclaimed == 1
    assert owner(rt, item) is None
    assert rt.tracker.checkout("p", item, "w2", max_lost=3).status is LeaseStatus.OK


def test_saves_wait_for_their_batch_under_the_workers_lease_with_another_broker(
        redis_url, server, tmp_path):  # noqa: F811
    """A broker whose queue cannot be read: each page waits under its worker's lease until its
    batch is out (if the worker dies first, it is reclaimed a lease later, not a save timeout
    later), then in the broker's hands."""
    rt, pipe, rec, server = pipeline_env(redis_url, server, tmp_path, save_batch_size=8,
                                         save_batch_seconds=5, broker_url=AMQP)
    assert not rt.finds_lost_saves
    items = [server.base + "/ok", server.base + "/hostile"]
    rt.tracker.add("p", items)
    for item in items:
        assert pipe.scrape("p", item) == "scraped"
    assert rec.batches == []
    assert all(owner(rt, item).startswith(rt.worker_id + " ") for item in items)
    assert all(_pending_for(rt, item) <= 31 for item in items)  # a lease (30 s)
    assert rt.tracker.checkout("p", items[0], "w2", max_lost=3).status is LeaseStatus.BUSY
    assert pipe.flush()
    [batch] = rec.batches
    assert [item for item, _, _ in batch] == items
    assert all(owner(rt, item).startswith("- ") for item in items)  # in the broker's hands
    assert all(_pending_for(rt, item) > 60 for item in items)
    assert pipe.save_batch("p", batch) == ["saved", "saved"]
    assert rt.tracker.stats("p").done == 2


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_a_save_message_per_page_is_sent_and_the_item_then_waits_for_it(
        redis_url, server, tmp_path, broker):  # noqa: F811
    """save_batch_size 1. Where a worker cannot read the broker's queue, the item waits under
    this worker's lease until its save message is out; then (and with the Redis broker, from
    the start) the broker holds it, for the save timeout."""
    rt, pipe, rec, server = pipeline_env(redis_url, server, tmp_path, save_batch_size=1,
                                         **({"broker_url": AMQP} if broker == "amqp" else {}))
    item = server.base + "/ok"
    rt.tracker.add("p", [item])
    owners_when_sent = []
    real_save = rec.save
    rec.save = lambda *a, **kw: (owners_when_sent.append(owner(rt, item)), real_save(*a, **kw))
    assert pipe.scrape("p", item) == "scraped"
    [(_, _, token, _)] = rec.saves
    keeper = rt.worker_id if broker == "amqp" else "-"
    assert owners_when_sent == [f"{keeper} {token}"]
    assert owner(rt, item) == f"- {token}"
    assert _pending_for(rt, item) > 60  # the save timeout (5 leases of 30 s + 30 s), not a lease


def _pending_for(rt, item):
    """Seconds until the save-pending ``item`` is reclaimed (on Redis's clock; deadlines are in
    microseconds)."""
    now = float(rt.tracker.client.time()[0])
    return rt.tracker.client.zscore(JobKeys("p").pending, item) / 1e6 - now


@pytest.mark.parametrize("batch_size", [1, 8])
def test_a_worker_takes_the_items_of_a_save_message_it_receives_at_its_heartbeat(
        redis_url, server, tmp_path, monkeypatch, batch_size):  # noqa: F811
    """A save message (per page or a batch) that leaves the broker for a worker: receiving it
    costs no round trip; the worker's next heartbeat takes its items into its hands, and from
    then on they follow its lease."""
    from distscrape_celery.worker import agent, signals

    rt, pipe, rec, server = pipeline_env(redis_url, server, tmp_path, save_batch_size=batch_size)
    items = [server.base + "/ok", server.base + "/ok2"]
    rt.tracker.add("p", items)
    for item in items:
        assert pipe.scrape("p", item) == "scraped"
    assert pipe.flush()
    assert all(owner(rt, item).startswith("- ") for item in items)
    receiver = rt.tracker.register_worker("receiver", 2, 4)
    monkeypatch.setattr(rt, "worker_id", receiver)
    if batch_size == 1:
        requests = [FakeRequest(SAVE_TASK, list(entry)) for entry in rec.saves]
    else:
        requests = [FakeRequest(SAVE_BATCH_TASK, ["p", [list(e) for e in batch]])
                    for batch in rec.batches]
    tokens = {item: token for _, item, token, _ in rec.saves}

    def held():  # Celery's books: the messages received, reserved and not started
        h = agent.Held()
        h.items, h.saves = list(items), list(tokens.items())
        return {"p": h}

    beat = agent.WorkerAgent(rt, concurrency=4, publish=rec.scrape, held_items=held)
    monkeypatch.setattr(signals, "_agent", beat)
    for request in requests:
        signals._on_task_received(request)
    assert all(owner(rt, item) == f"- {tokens[item]}" for item in items)
    beat.tick()
    for item in items:
        assert owner(rt, item) == f"{receiver} {tokens[item]}"
        assert _pending_for(rt, item) <= 31  # a lease (30 s) from now


def test_a_batch_that_cannot_be_queued_hands_its_items_back_counting_nothing(batch_env):
    rt, pipe, rec, server = batch_env

    def broker_down(job, saves):
        raise ConnectionError("broker unreachable")

    rec.save_batch = broker_down
    items = [server.base + "/ok", server.base + "/ok2"]
    rt.tracker.add("p", items)
    for item in items:
        assert pipe.scrape("p", item) == "scraped"
    assert pipe.flush()
    s = rt.tracker.stats("p")
    assert (s.save_pending, s.leased, s.queued, s.done) == (0, 0, 2, 0)  # back in the queue, at once
    assert list(rt.tracker.client.scan_iter(JobKeys("p").prefix + "body:*")) == []
    co = rt.tracker.checkout("p", items[0], "w2", max_lost=3)
    assert (co.status, co.failed_attempts) == (LeaseStatus.OK, 0)


def test_a_save_batch_saves_each_item_whatever_happened_to_the_others(batch_env):
    """One item of the batch was saved already (a duplicate message): the others are saved."""
    rt, pipe, rec, server = batch_env
    items = [server.base + "/ok", server.base + "/ok2", server.base + "/hostile"]
    rt.tracker.add("p", items)
    for item in items:
        pipe.scrape("p", item)
    pipe.flush()
    [batch] = rec.batches
    assert pipe.save_batch("p", batch[:1]) == ["saved"]
    assert pipe.save_batch("p", batch) == ["save-skipped-done", "saved", "saved"]
    assert rt.tracker.stats("p").done == 3


# -- the worker's heartbeat -------------------------------------------------------------------


class FakeRequest:
    def __init__(self, name, args, eta=None):
        self.name, self.args, self.time_start, self.eta = name, args, None, eta


def test_heartbeat_keeps_every_item_of_a_reserved_or_running_save_batch(monkeypatch):
    from celery.worker import state

    meta = {"url": "u"}
    running = FakeRequest(SAVE_BATCH_TASK, ["j", [["a", 1, meta], ["b", 2, meta]]])
    reserved = FakeRequest(SAVE_BATCH_TASK, ["j", [["c", 3, meta]]])
    single = FakeRequest(SAVE_TASK, ["j", "d", 4, meta])
    scrape = FakeRequest(SCRAPE_TASK, ["k", "e"])
    monkeypatch.setattr(state, "active_requests", {running, scrape})
    monkeypatch.setattr(state, "reserved_requests", {reserved, single})
    held = reserved_items()
    assert sorted(held["j"].items) == ["a", "b", "c", "d"]
    assert sorted(held["j"].running) == ["a", "b"]
    assert sorted(held["j"].saves) == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    assert (held["k"].items, held["k"].running, held["k"].saves) == (["e"], ["e"], [])


def test_heartbeat_keeps_the_item_of_a_deferred_save_waiting_for_its_eta(monkeypatch):
    """A save deferred because the output was full comes back with an ETA: it waits in the
    worker's timer (Celery's scheduled requests), not among its reserved ones. The worker took
    its item into its hands as it arrived, so its heartbeat must keep it until the ETA: with a
    retry delay as long as the lease, the item was reclaimed as "lost" and downloaded again
    (test_worker_faults.py's full-disk test, now and then)."""
    from celery.worker import state

    waiting = FakeRequest(SAVE_TASK, ["j", "a", 7, {"url": "u"}], eta="2026-01-01T00:00:05")
    monkeypatch.setattr(state, "active_requests", set())
    monkeypatch.setattr(state, "reserved_requests", set())
    monkeypatch.setattr(state, "scheduled_requests", {waiting}, raising=False)
    held = reserved_items()
    assert (held["j"].items, held["j"].running, held["j"].saves) == (["a"], [], [("a", 7)])


class _ChangingWhileRead(weakref.WeakSet):
    """A request set that another thread changes while it is iterated."""

    def __iter__(self):
        raise RuntimeError("Set changed size during iteration")


def test_heartbeat_reads_celerys_request_sets_while_the_consumer_changes_them(monkeypatch):
    """The heartbeat thread reads Celery's request sets while the consumer thread adds to them:
    iterating them could fail and cost a heartbeat (no lease kept that time)."""
    from celery.worker import state

    running = FakeRequest(SCRAPE_TASK, ["k", "e"])
    reserved = FakeRequest(SAVE_TASK, ["j", "d", 4, {"url": "u"}])
    waiting = FakeRequest(SAVE_TASK, ["j", "a", 7, {"url": "u"}], eta="2026-01-01T00:00:05")
    sets = {}
    for name, request in (("active_requests", running), ("reserved_requests", reserved),
                          ("scheduled_requests", waiting)):
        sets[name] = _ChangingWhileRead([request])
        monkeypatch.setattr(state, name, sets[name], raising=False)
    held = reserved_items()
    assert sorted(held["j"].saves) == [("a", 7), ("d", 4)]
    assert held["k"].running == ["e"]


def _record_dispatch(monkeypatch, rt, method):
    """What each call of the tracker's ``method`` handed out for scraping, call by call."""
    handed = []
    real = getattr(rt.tracker, method)

    def call(*args, **kw):
        res = real(*args, **kw)
        handed.append(list(res.dispatch))
        return res

    monkeypatch.setattr(rt.tracker, method, call)
    return handed


def test_what_a_checkout_hands_out_rides_with_the_save_or_goes_at_once(batch_env, monkeypatch):
    """The items a checkout hands out for scraping go to the broker with the page's batch of
    saves when the page is scraped, and at once when it ends any other way (here: a 404)."""
    rt, pipe, rec, server = batch_env
    handed = _record_dispatch(monkeypatch, rt, "checkout")
    ok, gone = server.base + "/ok", server.base + "/gone"
    # Another domain (never fetched here: only handed out) keeps the site's in-flight cap out of it.
    rt.tracker.add("p", [ok, gone] + [f"http://more.invalid/{n}" for n in range(20)])
    assert pipe.scrape("p", gone) == "dead"
    assert handed[-1] and set(handed[-1]) <= set(rec.scrapes)  # no save to ride with
    assert pipe.scrape("p", ok) == "scraped"
    assert handed[-1] and not set(handed[-1]) & set(rec.scrapes)  # waiting with the save
    assert pipe.flush()
    assert set(handed[-1]) <= set(rec.scrapes)


def _capped_env(redis_url, server, tmp_path, politeness):
    return pipeline_env(redis_url, server, tmp_path, politeness=politeness,
                        save_batch_size=8, save_batch_seconds=5)


def _assert_only_the_save_waited(pipe, rec, item):
    """The page's save waited for its batch (the scrape messages did not): sent on flush."""
    assert rec.batches == []
    assert pipe.flush()
    assert [[entry for entry, _, _ in batch] for batch in rec.batches] == [[item]]


# More than the broker's bound (2 x 4 slots), on other domains (never fetched here: only handed
# out): a checkout, freeing a place in the broker, hands one out.
OTHER_DOMAINS = [f"http://more{n}.invalid/" for n in range(20)]

# A per-domain cap below the live worker's 4 task slots: the job's, or one domain's own.
CAPPED = [
    {"per_domain_concurrency": 2},
    {"per_domain_concurrency": 100, "domain_overrides": {"127.0.0.1": {"concurrency": 2},
                                                         "slow.invalid": {"concurrency": 3}}},
]


@pytest.mark.parametrize("politeness", CAPPED)
def test_under_a_cap_the_workers_could_fill_what_a_checkout_hands_out_goes_at_once(
        redis_url, server, tmp_path, monkeypatch, politeness):  # noqa: F811
    """A held scrape message counts as in flight: under a per-domain cap below the live workers'
    task slots, waiting for the save batch stretched each fetch cycle of a domain by the batch's
    wait (the one-site crawl with the default cap of 8 ran at a quarter to a half of its pages/s).
    The saves still wait for their batch."""
    rt, pipe, rec, server = _capped_env(redis_url, server, tmp_path, politeness)
    handed = _record_dispatch(monkeypatch, rt, "checkout")
    ok = server.base + "/ok"
    rt.tracker.add("p", [ok] + OTHER_DOMAINS)
    assert pipe.scrape("p", ok) == "scraped"
    assert handed[-1] and set(handed[-1]) <= set(rec.scrapes)
    _assert_only_the_save_waited(pipe, rec, ok)


def test_under_such_a_cap_what_the_broker_refuses_at_once_goes_with_the_save(
        redis_url, server, tmp_path, monkeypatch):  # noqa: F811
    rt, pipe, rec, server = _capped_env(redis_url, server, tmp_path, CAPPED[0])
    handed = _record_dispatch(monkeypatch, rt, "checkout")
    real_scrape, refused = rec.scrape, []

    def broker_down_once(job, items):
        if not refused:
            refused.extend(items)
            raise ConnectionError("broker unreachable")
        real_scrape(job, items)

    rec.scrape = broker_down_once
    ok = server.base + "/ok"
    rt.tracker.add("p", [ok] + OTHER_DOMAINS)
    assert pipe.scrape("p", ok) == "scraped"
    assert handed[-1] and refused == handed[-1] and not set(refused) & set(rec.scrapes)
    _assert_only_the_save_waited(pipe, rec, ok)
    assert set(refused) <= set(rec.scrapes)  # the batch sent them, with the save


@pytest.mark.parametrize("politeness", CAPPED)
def test_under_a_cap_the_workers_could_fill_what_a_scraped_page_hands_out_goes_at_once(
        redis_url, server, tmp_path, monkeypatch, politeness):  # noqa: F811
    rt, pipe, rec, server = _capped_env(redis_url, server, tmp_path, politeness)
    handed = _record_dispatch(monkeypatch, rt, "scraped")
    ok = server.base + "/ok"
    # Two of the site's three in flight (its cap), the third queued: the page's end, freeing a
    # place under the cap, hands one out.
    rt.tracker.add("p", [ok, server.base + "/gone", server.base + "/hostile"])
    assert pipe.scrape("p", ok) == "scraped"
    assert handed[-1] and set(handed[-1]) <= set(rec.scrapes)
    _assert_only_the_save_waited(pipe, rec, ok)


def test_with_caps_the_workers_cannot_fill_a_scraped_page_reopening_its_domain_sends_at_once(
        redis_url, server, tmp_path, monkeypatch):  # noqa: F811
    """A cap of 4, the live workers' slots: what a checkout hands out goes with the page's save,
    but the item a page hands out as it ends (its fetch over, its domain has a place again) is
    sent at once: nothing in the broker was waiting for that place."""
    rt, pipe, rec, server = _capped_env(redis_url, server, tmp_path, {"per_domain_concurrency": 4})
    checked_out = _record_dispatch(monkeypatch, rt, "checkout")
    handed = _record_dispatch(monkeypatch, rt, "scraped")
    ok = server.base + "/ok"
    rt.tracker.add("p", [server.base + path for path in ROUTES])  # 4 in flight, 1 queued
    assert pipe.scrape("p", ok) == "scraped"
    assert checked_out[-1] == []  # the domain was at its cap
    assert handed[-1] and set(handed[-1]) <= set(rec.scrapes)
    _assert_only_the_save_waited(pipe, rec, ok)


# -- the group commit -------------------------------------------------------------------------


def _scraped_batch(rt, pipe, rec, server, paths=("/ok", "/ok2", "/hostile")):
    items = [server.base + p for p in paths]
    rt.tracker.add("p", items)
    for item in items:
        assert pipe.scrape("p", item) == "scraped"
    assert pipe.flush()
    [batch] = rec.batches
    return items, batch


def test_a_save_batch_stores_its_items_as_one_group_and_only_then_marks_them_done(
    batch_env, monkeypatch
):
    """The bodies go to the saver in one save_many (the file saver makes them durable
    together), and no item is done before the whole group is stored; then one round trip
    completes them all and drops their bodies."""
    rt, pipe, rec, server = batch_env
    items, batch = _scraped_batch(rt, pipe, rec, server)
    saver = rt.saver("p")
    groups, done_during = [], []
    real_save_many = saver.save_many

    def save_many(entries):
        groups.append([item for item, _ in entries])
        done_during.append(rt.tracker.stats("p").done)
        return real_save_many(entries)

    monkeypatch.setattr(saver, "save_many", save_many)
    monkeypatch.setattr(saver, "save", lambda *a: pytest.fail("saved one at a time"))
    completes = []
    real_complete_many = rt.tracker.complete_many
    monkeypatch.setattr(rt.tracker, "complete_many",
                        lambda job, saves: (completes.append(list(saves)), real_complete_many(job, saves))[1])
    monkeypatch.setattr(rt.tracker, "complete", lambda *a, **k: pytest.fail("completed one at a time"))
    assert pipe.save_batch("p", batch) == ["saved"] * 3
    assert groups == [items] and done_during == [0]
    assert [item for item, _ in completes[0]] == items
    assert rt.tracker.stats("p").done == 3
    assert list(rt.tracker.client.scan_iter(JobKeys("p").prefix + "body:*")) == []


def test_a_group_entry_that_fails_is_retried_alone_and_the_others_are_done(batch_env, monkeypatch):
    """One body of the group cannot be stored (the saver's error for that entry), another hits a
    full disk: that one is kept and retried later, the failing one counts an attempt, the rest
    are done."""
    from distscrape_celery.errors import SaveError
    from tests.support.pipeline import full_disk_save

    rt, pipe, rec, server = batch_env
    items, batch = _scraped_batch(rt, pipe, rec, server)
    saver = rt.saver("p")
    real_save_many = saver.save_many

    def save_many(entries):
        out = real_save_many(entries[1:])
        try:
            full_disk_save(entries[0][0], entries[0][1])
        except SaveError as exc:
            return [exc, SaveError("the disk said no"), *out[1:]]

    monkeypatch.setattr(saver, "save_many", save_many)
    assert pipe.save_batch("p", batch) == ["deferred", "retry", "saved"]
    s = rt.tracker.stats("p")
    assert (s.done, s.dead) == (1, 0)
    assert rec.saves and rec.saves[-1][1] == items[0]  # the deferred save, queued for later


def test_a_batch_interrupted_before_saves_and_completes_item_by_item(batch_env, monkeypatch):
    """A batch one of whose items lost its holder before (a save that killed its process, say)
    goes item by item, so that a save that kills again costs the others no second write."""
    rt, pipe, rec, server = batch_env
    items, batch = _scraped_batch(rt, pipe, rec, server)
    worker = rt.worker_id
    # The batch's first run vanished with its process: its items are saving under a lease that ran out.
    assert all(b.status.value == "ok" for b in rt.tracker.begin_saves(
        "p", [(item, token) for item, token, _ in batch], worker, max_lost=3))
    client = rt.tracker.client
    client.zadd(JobKeys("p").leased, {item: 1 for item in items})
    saver = rt.saver("p")
    monkeypatch.setattr(saver, "save_many", lambda entries: pytest.fail("stored as a group"))
    assert pipe.save_batch("p", batch) == ["saved"] * 3
    assert rt.tracker.stats("p").done == 3


def test_a_saver_without_group_commits_has_each_item_done_as_soon_as_it_is_stored(
    batch_env, monkeypatch
):
    """A saver that does not commit groups (an archive saver, the file saver without fsync, one
    that overrides save) gets each item on its own, and each is done before the next is saved:
    a save that kills its process costs the items before it no second write."""
    rt, pipe, rec, server = batch_env
    items, batch = _scraped_batch(rt, pipe, rec, server)
    saver = rt.saver("p")
    monkeypatch.setattr(saver, "commits_groups", lambda: False)
    monkeypatch.setattr(saver, "save_many", lambda entries: pytest.fail("stored as a group"))
    done_before = []
    real_save = saver.save
    monkeypatch.setattr(saver, "save", lambda item, download: (
        done_before.append(rt.tracker.stats("p").done), real_save(item, download))[1])
    assert pipe.save_batch("p", batch) == ["saved"] * 3
    assert done_before == [0, 1, 2]


def test_the_file_saver_without_fsync_has_a_batch_done_in_one_round_trip(batch_env, monkeypatch):
    """Found while measuring: with ``fsync = false`` the file saver did not count as committing
    groups, so each page of a batch cost a ``complete`` round trip of its own, and the crawl ran
    slower than with fsync on (the job spec said false is faster). It has nothing to flush: its
    pages are written one by one, then marked done together."""
    rt, pipe, rec, server = batch_env
    items, batch = _scraped_batch(rt, pipe, rec, server)
    saver = rt.saver("p")
    monkeypatch.setattr(saver, "fsync", False)
    done_before, completions = [], []
    real_save = saver.save
    monkeypatch.setattr(saver, "save", lambda item, download: (
        done_before.append(rt.tracker.stats("p").done), real_save(item, download))[1])
    for name in ("complete", "complete_many"):
        real = getattr(rt.tracker, name)
        monkeypatch.setattr(rt.tracker, name, lambda *a, _real=real, _name=name, **k: (
            completions.append(_name), _real(*a, **k))[1])
    assert pipe.save_batch("p", batch) == ["saved"] * 3
    assert done_before == [0, 0, 0] and completions == ["complete_many"]
    assert rt.tracker.stats("p").done == 3
    assert not list((rt.saver("p").output).rglob(".~tmp-*"))


def test_what_a_page_hands_out_while_the_frontier_is_dry_goes_at_once(batch_env, monkeypatch):
    """When the tracker hands out the links a page found (it had room under its bound: the
    frontier ran dry, as in a crawl's first levels and its last), they go to the broker now, with
    what the checkout handed out; only the save waits for its batch. Before, each level of a
    crawl waited out the batch's wait (50 ms) before any of its pages could be fetched."""
    rt, pipe, rec, server = batch_env
    checked_out = _record_dispatch(monkeypatch, rt, "checkout")
    ok, leaf = server.base + "/ok", server.base + "/ok2"
    rt.tracker.add("p", [ok])
    assert pipe.scrape("p", ok) == "scraped"
    assert leaf in rec.scrapes and set(checked_out[-1]) <= set(rec.scrapes)
    assert rec.batches == []  # the save still waits for its batch
    assert pipe.flush()
    assert [[entry for entry, _, _ in batch] for batch in rec.batches] == [[ok]]
    assert rec.scrapes.count(leaf) == 1


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_a_stopping_worker_gives_back_its_unsent_batch_and_returns_its_reserved_saves(
        redis_url, server, tmp_path, monkeypatch, broker):  # noqa: F811
    """Found in CI (SIGTERM to a worker's process group): the pool processes died with saves
    kept for a batch they never queued, and the worker's stop gave those pages the save timeout
    as if their messages were coming back from the broker. Only saves whose messages reached the
    worker (and go back to the broker) wait for them, though Celery has forgotten its reserved
    messages by the time the worker stops. An unsent page held by the worker is queued again at
    once; with the Redis broker nobody holds it, and the live workers' check of the save queue
    finds it."""
    from distscrape_celery.worker import agent, signals
    from distscrape_celery.worker.lost_saves import LostSaves

    rt, pipe, rec, server = pipeline_env(redis_url, server, tmp_path, save_batch_size=8,
                                         save_batch_seconds=5,
                                         **({"broker_url": AMQP} if broker == "amqp" else {}))
    sent = [server.base + "/ok", server.base + "/hostile"]
    rt.tracker.add("p", sent)
    for item in sent:
        assert pipe.scrape("p", item) == "scraped"
    assert pipe.flush()
    [batch] = rec.batches
    worker = agent.WorkerAgent(rt, concurrency=4, publish=rec.scrape, held_items=dict)
    monkeypatch.setattr(signals, "_agent", worker)
    signals._on_task_received(FakeRequest(SAVE_BATCH_TASK, ["p", [list(e) for e in batch]]))
    tokens = {item: token for item, token, _ in batch}
    unsent = server.base + "/ok2"  # found in both; scraped into a batch that is never queued
    assert pipe.scrape("p", unsent) == "scraped"
    keeper = rt.worker_id if broker == "amqp" else "-"
    assert owner(rt, unsent).startswith(keeper + " ")

    worker.stop()
    for item in sent:  # back in the broker's hands, for the save timeout
        assert owner(rt, item) == f"- {tokens[item]}"
        assert _pending_for(rt, item) > 60
    if broker == "redis":
        assert owner(rt, unsent).startswith("- ")
        finder = LostSaves(rt.tracker, rt.tracker.client, rt.settings.save_queue, age=0)
        # The recorder put no message in the queue, so the sent pages count as missing too.
        assert [finder.check("p") for _ in range(3)] == [0, 0, 3]
        assert rt.tracker.maintain("p", max_lost=3).reclaimed == 3
    assert owner(rt, unsent) is None
    assert rt.tracker.checkout("p", unsent, "w2", max_lost=3).status is LeaseStatus.OK
