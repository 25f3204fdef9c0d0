"""The tracker contract, run on InMemoryTracker and on RedisTracker against a real Redis."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import redis

from distscrape_celery.errors import JobConflict, JobNotFound
from distscrape_celery.tracker import keys
from distscrape_celery.tracker.redis.staging import RedisBodyStaging
from distscrape_celery.tracker import (
    MAX_ADD_BATCH,
    CrawlLimits,
    DomainLimits,
    FailOutcome,
    Fault,
    InMemoryTracker,
    LeaseStatus,
    RedisTracker,
    SaveStart,
)
from tests.support.jobs import SCRIPT_COMMANDS, SPEC, new_job, script_calls

LOST = 10  # max_lost where a test does not care


def lease(t, item, worker, job="j", max_lost=LOST):
    """Check ``item`` out and return its token (the checkout must succeed)."""
    co = t.checkout(job, item, worker, max_lost=max_lost)
    assert co.status is LeaseStatus.OK, co
    return co.token


def fail(t, item, token, reason="boom", job="j", fault=Fault.ITEM, max_retries=3, max_lost=LOST,
         **kw):
    return t.fail(job, item, token, reason, fault=fault, max_retries=max_retries,
                  max_lost=max_lost, **kw)


def test_worker_ids_unique_and_liveness(tracker_factory):
    t = tracker_factory(lease_seconds=0.5, dispatch_factor=3)
    assert t.dispatch_bound() == 0
    a = t.register_worker("h1", 10, 2)
    b = t.register_worker("h2", 11, 5)
    assert a != b
    assert t.dispatch_bound() == 3 * (2 + 5)
    t.deregister_worker(b)
    assert t.dispatch_bound() == 3 * 2
    alive = {w.id: w.alive for w in t.workers()}
    assert alive == {a: True, b: False}
    time.sleep(0.7)  # a missed its heartbeats for longer than a lease
    assert t.dispatch_bound() == 0
    t.heartbeat(a)
    assert t.dispatch_bound() == 6
    assert [w.host for w in t.workers()] == ["h1", "h2"]


def test_add_deduplicates_and_counts(tracker_factory):
    t = tracker_factory()
    t.create_job("j", SPEC)
    assert t.add("j", ["a", "b", "a"]).added == 2
    assert t.add("j", ["b", "c"]).added == 1
    s = t.stats("j")
    assert (s.seen, s.queued, s.leased, s.done, s.dead) == (3, 3, 0, 0, 0)
    assert s.started and not s.finished


def test_dispatch_is_bounded_by_live_concurrency(tracker_factory):
    t = tracker_factory(dispatch_factor=2)
    wid = new_job(t, concurrency=2)  # bound 4
    res = t.add("j", [f"i{n}" for n in range(10)])
    assert res.dispatch == ["i0", "i1", "i2", "i3"]
    s = t.stats("j")
    assert (s.frontier, s.dispatched, s.queued) == (6, 4, 10)
    # Nothing more while the broker is full.
    assert t.add("j", ["i10"]).dispatch == []
    # A checkout frees a slot and refills it from the head of the frontier.
    co = t.checkout("j", "i0", wid, max_lost=LOST)
    assert co.status is LeaseStatus.OK and co.dispatch == ["i4"]
    s = t.stats("j")
    assert (s.frontier, s.dispatched, s.leased) == (6, 4, 1)


def test_checkout_is_exclusive_and_done_is_final(tracker_factory):
    t = tracker_factory()
    w1 = new_job(t)
    w2 = t.register_worker("other", 2, 1)
    t.add("j", ["x"], depth=3)
    co = t.checkout("j", "x", w1, max_lost=LOST)
    assert (co.status, co.depth) == (LeaseStatus.OK, 3)
    assert t.checkout("j", "x", w2, max_lost=LOST).status is LeaseStatus.BUSY
    assert t.complete("j", "x").changed is True
    assert t.complete("j", "x").changed is False  # idempotent
    assert t.checkout("j", "x", w2, max_lost=LOST).status is LeaseStatus.DONE
    assert t.checkout("j", "nope", w2, max_lost=LOST).status is LeaseStatus.UNKNOWN
    s = t.stats("j")
    assert (s.done, s.leased, s.queued) == (1, 0, 0)
    assert s.finished


def test_deadlines_are_whole_microseconds_of_redis_time(tracker_factory):
    """Deadlines are integer scores: Redis keeps a small sorted set's scores as text and parses a
    fractional one at every step of a search, several times the cost. A lease's deadline is a
    lease from Redis's clock, in microseconds."""
    t = tracker_factory(lease_seconds=30)
    w = new_job(t)
    t.add("j", ["a", "b", "c"])
    secs, usecs = t.client.time()
    before = secs * 1_000_000 + usecs
    assert t.checkout("j", "a", w, max_lost=LOST).status is LeaseStatus.OK
    k = keys.JobKeys("j")
    scores = [score for zset in (k.leased, k.dispatched, k.domains)
              for _, score in t.client.zrange(zset, 0, -1, withscores=True)]
    assert len(scores) >= 2 and all(score == int(score) for score in scores), scores
    assert before + 30_000_000 <= t.client.zscore(k.leased, "a") <= before + 31_000_000


def test_fail_retries_then_dead_never_done(tracker_factory):
    t = tracker_factory()
    w = new_job(t)
    t.add("j", ["x"])
    for attempt in (1, 2):
        token = lease(t, "x", w)
        assert fail(t, "x", token, f"boom {attempt}", max_retries=2).outcome is FailOutcome.RETRY
        assert t.stats("j").queued == 1
    co = t.checkout("j", "x", w, max_lost=LOST)
    assert co.failed_attempts == 2
    assert fail(t, "x", co.token, "boom 3", max_retries=2).outcome is FailOutcome.DEAD
    assert t.checkout("j", "x", w, max_lost=LOST).status is LeaseStatus.DEAD
    assert t.complete("j", "x").changed is False  # a dead item never becomes done
    assert fail(t, "x", co.token, "again", max_retries=2).outcome is FailOutcome.IGNORED
    s = t.stats("j")
    assert (s.done, s.dead, s.queued, s.leased, s.finished) == (0, 1, 0, 0, True)
    assert t.dead_items("j") == {"x": "boom 3"}


def test_non_retryable_and_free_failures(tracker_factory):
    t = tracker_factory()
    w = new_job(t)
    t.add("j", ["a", "b"])
    token = lease(t, "a", w)
    assert fail(t, "a", token, "HTTP 404", max_retries=5, retryable=False).outcome is FailOutcome.DEAD
    for _ in range(3):  # hand-backs that count nothing never exhaust anything
        token = lease(t, "b", w)
        assert fail(t, "b", token, "broker refused", fault=Fault.FREE, max_retries=0,
                    max_lost=0).outcome is FailOutcome.RETRY
    assert t.checkout("j", "b", w, max_lost=0).failed_attempts == 0
    assert t.dead_items("j") == {"a": "HTTP 404"}


def test_extend_keeps_lease_and_maintain_reclaims_expired(tracker_factory):
    t = tracker_factory(lease_seconds=0.5)
    w = new_job(t)
    t.add("j", ["held", "lost"])
    lease(t, "held", w)
    lease(t, "lost", w)
    for _ in range(3):
        time.sleep(0.25)
        t.heartbeat(w)
        assert t.extend("j", ["held"], w) == 1
    res = t.maintain("j", max_lost=3)
    assert res.reclaimed == 1
    assert "lost" in res.dispatch  # handed straight back out
    assert t.checkout("j", "held", "w-other", max_lost=LOST).status is LeaseStatus.BUSY
    co = t.checkout("j", "lost", "w-other", max_lost=LOST)
    # A vanished holder is not the item's fault: it does not count against max_retries.
    assert co.status is LeaseStatus.OK and co.failed_attempts == 0
    assert t.maintain("j", max_lost=3).reclaimed == 0


def test_extend_only_for_the_holder(tracker_factory):
    """A stale duplicate message on a live worker must not keep a vanished worker's lease."""
    t = tracker_factory(lease_seconds=0.5)
    w = new_job(t)
    other = t.register_worker("h2", 2, 1)
    t.add("j", ["x"])
    lease(t, "x", w)
    for _ in range(3):
        time.sleep(0.25)
        assert t.extend("j", ["x"], other) == 0
    assert t.maintain("j", max_lost=3).reclaimed == 1


def test_vanished_holders_count_against_max_lost_not_retries(tracker_factory):
    """Three worker kills must not kill a healthy page (max_retries=1), but a page that kills
    every worker still ends dead once max_lost is used up."""
    t = tracker_factory(lease_seconds=0.3)
    w = new_job(t)
    t.add("j", ["healthy", "poison"])
    for _ in range(3):
        lease(t, "healthy", w)
        time.sleep(0.35)
        t.heartbeat(w)
        assert t.maintain("j", max_lost=5).died == 0
    token = lease(t, "healthy", w)
    assert t.scraped("j", "healthy", token).held
    assert t.begin_save("j", "healthy", token, w, max_lost=5).status is SaveStart.OK
    assert t.complete("j", "healthy").changed

    died = 0
    for _ in range(3):
        co = t.checkout("j", "poison", w, max_lost=2)
        if co.status is LeaseStatus.DEAD:
            break
        time.sleep(0.35)
        t.heartbeat(w)
        died += t.maintain("j", max_lost=2).died
    assert died == 1
    assert "vanished" in t.dead_items("j")["poison"]
    s = t.stats("j")
    assert (s.done, s.dead, s.finished) == (1, 1, True)


def test_takeover_of_an_expired_lease_counts_as_lost(tracker_factory):
    t = tracker_factory(lease_seconds=0.3)
    w = new_job(t)
    t.add("j", ["x"])
    lease(t, "x", w, max_lost=0)
    time.sleep(0.35)
    # Nobody ran maintenance; the new checkout finds the expired lease itself.
    assert t.checkout("j", "x", "w-other", max_lost=0).status is LeaseStatus.DEAD
    assert "vanished" in t.dead_items("j")["x"]


def test_stale_holder_changes_nothing_but_a_late_save_completes(tracker_factory):
    t = tracker_factory(lease_seconds=0.3)
    w1 = new_job(t)
    w2 = t.register_worker("h2", 2, 1)
    t.add("j", ["x", "y"])
    old = lease(t, "x", w1)
    time.sleep(0.35)
    t.heartbeat(w1)
    t.maintain("j", max_lost=LOST)
    new = lease(t, "x", w2)
    assert new != old
    # The stale holder cannot fail the live lease, make it dead, or make it save-pending.
    assert fail(t, "x", old, max_retries=0, retryable=False).outcome is FailOutcome.IGNORED
    assert t.scraped("j", "x", old, ["found-by-stale"], 1).held is False
    assert t.defer_save("j", "x", old) is False
    assert t.checkout("j", "x", "w3", max_lost=LOST).status is LeaseStatus.BUSY
    assert t.stats("j").dead == 0
    # Its finds are real and are queued all the same.
    assert t.stats("j").seen == 3
    # A save under the stale token that succeeds still completes the item.
    assert t.begin_save("j", "x", old, w1, max_lost=LOST).status is SaveStart.STALE
    assert t.complete("j", "x").changed
    # The live holder's later reports change nothing.
    assert t.scraped("j", "x", new).held is False
    assert fail(t, "x", new, retryable=False).outcome is FailOutcome.IGNORED
    assert t.begin_save("j", "x", new, w2, max_lost=LOST).status is SaveStart.DONE
    s = t.stats("j")
    assert (s.done, s.dead, s.leased) == (1, 0, 0)


def test_pending_save_outlives_leases(tracker_factory):
    """A save message that waits in the broker for many leases keeps its item: it is not
    reclaimed, scraped again or counted as a failure."""
    t = tracker_factory(lease_seconds=0.2, save_timeout=30)
    w = new_job(t)
    t.add("j", ["x"])
    token = lease(t, "x", w)
    assert t.scraped("j", "x", token).held
    for _ in range(5):  # ~5 leases; no heartbeat holds it, nobody extends it
        time.sleep(0.2)
        assert t.maintain("j", max_lost=0).reclaimed == 0
    assert t.checkout("j", "x", "w2", max_lost=0).status is LeaseStatus.BUSY
    s = t.stats("j")
    assert (s.save_pending, s.leased, s.queued, s.finished) == (1, 0, 0, False)
    assert t.begin_save("j", "x", token, w, max_lost=0).status is SaveStart.OK
    assert t.complete("j", "x").changed
    assert t.stats("j").finished


def body_reader(t):
    """The staging that reads what ``t`` stages, as the runtime pairs them."""
    if isinstance(t, InMemoryTracker):
        return t.bodies  # a client of its private server
    kw = {**t.client.get_connection_kwargs(), "decode_responses": False}
    return RedisBodyStaging(redis.Redis(connection_pool=redis.ConnectionPool(**kw)), 60)


def test_scraped_stages_the_body_and_complete_drops_it(tracker_factory):
    """The body rides with the state change (one round trip each way, in Redis), is staged
    only under the lease that holds the item, and is dropped by complete with its token."""
    t = tracker_factory(lease_seconds=0.3, save_timeout=30)
    bodies = body_reader(t)
    w = new_job(t)
    t.add("j", ["x"])
    old = lease(t, "x", w)
    time.sleep(0.4)
    t.maintain("j", max_lost=LOST)  # the lease ran out: x is queued again
    new = lease(t, "x", w)
    assert t.scraped("j", "x", old, body=b"stale page").held is False
    assert bodies.get("j", old) is None  # a stale holder stages nothing (nothing to drop)
    assert t.scraped("j", "x", new, body=b"\x00page\xff").held
    assert bodies.get("j", new) == b"\x00page\xff"  # bytes kept as they are
    assert t.begin_save("j", "x", new, w, max_lost=LOST).status is SaveStart.OK
    assert t.complete("j", "x", new).changed
    assert bodies.get("j", new) is None
    assert t.complete("j", "x", new).changed is False  # idempotent, body or not


def test_scraped_save_as_turns_the_item_saving_under_the_callers_lease(tracker_factory):
    """Save_inline: ``scraped(save_as=worker)`` stages nothing and leaves the item
    saving under a lease held by the caller, as begin_save would: its heartbeat keeps it, and if
    it vanishes the item is recovered like a save whose process died (one more lease for a save
    message that never comes, then queued again, counting a vanished holder)."""
    t = tracker_factory(lease_seconds=0.3, save_timeout=30)
    bodies = body_reader(t)
    w = new_job(t)
    t.add("j", ["x"])
    token = lease(t, "x", w)
    with pytest.raises(ValueError, match="exclude each other"):
        t.scraped("j", "x", token, body=b"page", save_as=w)
    assert t.scraped("j", "x", token, ["found"], 1, save_as=w).held
    assert bodies.get("j", token) is None
    s = t.stats("j")
    assert (s.save_pending, s.leased) == (0, 1)  # being saved under a lease, not waiting for a save
    assert t.checkout("j", "x", "w2", max_lost=LOST).status is LeaseStatus.BUSY
    for _ in range(3):  # its holder's heartbeat keeps it for three leases
        time.sleep(0.2)
        t.extend("j", [], w, running=["x"])
        t.maintain("j", max_lost=LOST)  # reclaims "found" (its message was never sent), not x
        assert t.checkout("j", "x", "w2", max_lost=LOST).status is LeaseStatus.BUSY
        assert t.stats("j").leased == 1
    assert t.complete("j", "x", token).changed
    assert t.stats("j").done == 1
    # A stale holder hands nothing to itself.
    t.add("j", ["y", "z"])
    old = lease(t, "y", w)
    time.sleep(0.4)
    t.maintain("j", max_lost=LOST)
    new = lease(t, "y", w)
    assert t.scraped("j", "y", old, save_as=w).held is False
    assert t.scraped("j", "y", new, save_as=w).held
    # The holder vanishes in the save: reclaimed once the saving lease and one more have passed.
    lost = lease(t, "z", w)
    assert t.scraped("j", "z", lost, save_as=w).held
    deadline = time.monotonic() + 5
    while (co := t.checkout("j", "z", w, max_lost=LOST)).status is not LeaseStatus.OK:
        assert co.status is LeaseStatus.BUSY and time.monotonic() < deadline, co
        time.sleep(0.1)
        t.maintain("j", max_lost=LOST)
    assert co.token != lost and t.scraped("j", "z", co.token, save_as=w).held


def test_kept_item_waits_under_its_keepers_lease_until_handoff(tracker_factory):
    """Save batches: ``scraped(keep_as=worker)`` stages the body and leaves the item
    waiting for its save under the keeper's lease, not the save timeout: if the keeper dies before
    it queued the save, the item is reclaimed a lease later. ``handoff`` then gives it the save
    timeout, and only for the keeper's own token; a save that began first is left alone."""
    t = tracker_factory(lease_seconds=0.3, save_timeout=30)
    bodies = body_reader(t)
    w = new_job(t)
    t.add("j", ["x", "y", "z"])
    with pytest.raises(ValueError, match="exclude each other"):
        t.scraped("j", "x", lease(t, "x", w), save_as=w, keep_as=w)
    time.sleep(0.4)
    t.maintain("j", max_lost=LOST)
    # The keeper dies before queuing the save: reclaimed a lease later, counting a lost holder.
    dying = lease(t, "x", w)
    assert t.scraped("j", "x", dying, body=b"x-page", keep_as=w).held
    assert bodies.get("j", dying) == b"x-page"
    assert t.checkout("j", "x", "w2", max_lost=LOST).status is LeaseStatus.BUSY
    assert t.stats("j").save_pending == 1
    time.sleep(0.4)
    assert t.maintain("j", max_lost=LOST).reclaimed >= 1
    co = t.checkout("j", "x", "w2", max_lost=LOST)
    assert co.status is LeaseStatus.OK and co.token != dying
    # Handed over: from then on it waits the save timeout, not a lease.
    kept = lease(t, "y", w)
    assert t.scraped("j", "y", kept, body=b"y-page", keep_as=w).held
    assert t.handoff("j", "w2", [("y", kept)]) == 0  # not w2's
    assert t.handoff("j", w, [("y", kept + 1)]) == 0  # not that token
    assert t.handoff("j", w, [("y", kept)]) == 1
    assert t.handoff("j", w, [("y", kept)]) == 0  # no longer w's
    time.sleep(0.4)
    t.maintain("j", max_lost=LOST)
    assert t.checkout("j", "y", "w2", max_lost=LOST).status is LeaseStatus.BUSY
    begin = t.begin_save("j", "y", kept, "w2", max_lost=LOST)
    assert (begin.status, begin.body, begin.lost) == (SaveStart.OK, b"y-page", 0)
    assert t.complete("j", "y", kept).changed
    # The save began before its keeper handed it over: the handoff leaves the save alone.
    raced = lease(t, "z", w)
    assert t.scraped("j", "z", raced, body=b"z-page", keep_as=w).held
    assert t.begin_save("j", "z", raced, "w2", max_lost=LOST).status is SaveStart.OK
    assert t.handoff("j", w, [("z", raced)]) == 0
    assert t.stats("j").save_pending == 0  # z is being saved by w2, not waiting
    assert t.checkout("j", "z", "w3", max_lost=LOST).status is LeaseStatus.BUSY
    assert t.complete("j", "z", raced).changed


def test_begin_saves_answers_as_begin_save_would_for_each(tracker_factory):
    """Save batches: one round trip begins every save of a batch (in Redis, one call of
    begin_save's batch form), each with its own answer and body, in order; after Redis lost its
    scripts too."""
    t = tracker_factory(lease_seconds=30, save_timeout=30)
    w = new_job(t)
    t.add("j", ["ok", "stale", "done", "busy"])
    body = bytes(range(256))
    tokens = {}
    for item in ("ok", "stale", "done", "busy"):
        tokens[item] = lease(t, item, w)
        assert t.scraped("j", item, tokens[item], body=body + item.encode()).held
    assert t.complete("j", "done", tokens["done"]).changed
    assert t.begin_save("j", "busy", tokens["busy"], "w2", max_lost=LOST).status is SaveStart.OK
    if isinstance(t, RedisTracker):
        t.client.script_flush()
    saves = [("ok", tokens["ok"]), ("stale", tokens["stale"] + 1), ("done", tokens["done"]),
             ("busy", tokens["busy"]), ("nothing", 7)]
    begins = t.begin_saves("j", saves, w, max_lost=LOST)
    assert [b.status for b in begins] == [
        SaveStart.OK, SaveStart.STALE, SaveStart.DONE, SaveStart.BUSY, SaveStart.UNKNOWN]
    assert begins[0].body == body + b"ok"
    assert begins[1].body is None  # no body staged under that token
    assert t.checkout("j", "ok", "w3", max_lost=LOST).status is LeaseStatus.BUSY
    assert t.complete("j", "ok", tokens["ok"]).changed
    assert t.begin_saves("j", [], w, max_lost=LOST) == []


def test_complete_many_answers_as_complete_would_for_each(tracker_factory):
    """Group commit: one round trip completes a save batch's items (in Redis, one call
    of complete's batch form), each with its own answer, dropping each staged body; what
    completing hands out is returned with the item that freed the room; after Redis lost its
    scripts too."""
    t = tracker_factory(lease_seconds=30, save_timeout=30, dispatch_factor=1, save_backlog_factor=1)
    bodies = body_reader(t)
    w = new_job(t, concurrency=2)
    t.add("j", ["a", "b", "done"])
    tokens = {}
    for item in ("a", "b", "done"):
        tokens[item] = lease(t, item, w)
        assert t.scraped("j", item, tokens[item], body=item.encode()).held
    assert t.complete("j", "done", tokens["done"]).changed
    # Two saves pending fill the broker's bound (1 x 2): "next" waits in its queue until a
    # complete frees room.
    assert t.add("j", ["next"]).dispatch == []
    if isinstance(t, RedisTracker):
        t.client.script_flush()
    saves = [("a", tokens["a"]), ("done", tokens["done"]), ("b", tokens["b"] + 100)]
    results = t.complete_many("j", saves)
    assert [r.changed for r in results] == [True, False, True]  # any token completes
    assert [x for r in results for x in r.dispatch] == ["next"]
    stats = t.stats("j")
    assert (stats.done, stats.dead) == (3, 0)
    assert [bodies.get("j", tokens[i]) for i in ("a", "b")] == [None, b"b"]  # b's token was another
    assert t.complete_many("j", []) == []


def test_a_save_batch_begins_and_completes_in_one_script_call_each(redis_url):
    """On one Redis, begin_saves and complete_many of a save batch each run one script, whose
    answers are those of begin_save and complete for each save, in order (a repeated save
    too)."""
    # The dispatch bound read once a while (not before every call, as the other tests ask).
    t = RedisTracker.from_url(redis_url, lease_seconds=30, save_timeout=30)
    w = new_job(t)
    items = [f"i{n}" for n in range(7)]
    t.add("j", items)
    tokens = {}
    for item in items:
        tokens[item] = lease(t, item, w)
        assert t.scraped("j", item, tokens[item], body=item.encode()).held
    saves = [(item, tokens[item]) for item in items]
    # Two saves first, so that Redis has the scripts: a call it has to load counts twice.
    t.begin_saves("j", saves[:2], w, max_lost=LOST)
    t.complete_many("j", saves[:2])
    batch = saves[2:] + saves[2:3]
    before = script_calls(t.client, SCRIPT_COMMANDS)
    begins = t.begin_saves("j", batch, w, max_lost=LOST)
    assert script_calls(t.client, SCRIPT_COMMANDS) - before == 1
    assert [b.status for b in begins] == [SaveStart.OK] * 5 + [SaveStart.BUSY]
    assert [b.body for b in begins[:5]] == [i.encode() for i in items[2:]]
    before = script_calls(t.client, SCRIPT_COMMANDS)
    done = t.complete_many("j", batch)
    assert script_calls(t.client, SCRIPT_COMMANDS) - before == 1
    assert [r.changed for r in done] == [True] * 5 + [False]
    assert t.stats("j").done == 7


def _commands(client, *names: str) -> int:
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in names)


def test_a_save_batch_tops_up_dispatch_once_with_the_room_of_all(redis_url):
    """A batch of saves looks for room in the broker once, after its last save (each look is
    two ZCARDs), and hands out what that room allows with its last reply."""
    t = RedisTracker.from_url(redis_url, lease_seconds=30, save_timeout=30, dispatch_factor=1,
                              bound_refresh_seconds=0)
    w = new_job(t, concurrency=3)  # room for 3 scrape messages
    saved = [f"http://a{n}.invalid/" for n in range(3)]
    assert t.add("j", saved).dispatch == saved
    saves = [(item, lease(t, item, w)) for item in saved]
    for item, token in saves:
        assert t.scraped("j", item, token).held
    t.begin_saves("j", saves, w, max_lost=LOST)
    waiting = [f"http://b{n}.invalid/" for n in range(6)]
    assert t.add("j", waiting).dispatch == waiting[:3]
    t.register_worker("host2", 2, 3)  # room for 3 more
    before = _commands(t.client, "zcard")
    done = t.complete_many("j", saves)
    assert _commands(t.client, "zcard") - before == 2
    assert [r.dispatch for r in done] == [[], [], waiting[3:]]
    assert [r.changed for r in done] == [True] * 3


def test_a_save_batch_whose_last_save_returns_early_still_tops_up(redis_url):
    """The batch's one top-up does not depend on its last call reaching its own: a last save
    that is stale (it returns before any top-up) still gets the batch's items."""
    t = RedisTracker.from_url(redis_url, lease_seconds=30, save_timeout=30, dispatch_factor=1,
                              bound_refresh_seconds=0)
    w = new_job(t, concurrency=3)
    saved = [f"http://a{n}.invalid/" for n in range(3)]
    assert t.add("j", saved).dispatch == saved
    saves = [(item, lease(t, item, w)) for item in saved]
    for item, token in saves:
        assert t.scraped("j", item, token).held
    waiting = [f"http://b{n}.invalid/" for n in range(6)]
    assert t.add("j", waiting).dispatch == waiting[:3]
    t.register_worker("host2", 2, 3)  # room for 3 more
    stale_last = saves[:2] + [(saves[2][0], saves[2][1] + 1000)]
    begins = t.begin_saves("j", stale_last, w, max_lost=LOST)
    assert [b.status for b in begins] == [SaveStart.OK, SaveStart.OK, SaveStart.STALE]
    assert [b.dispatch for b in begins] == [[], [], waiting[3:]]


def test_a_top_up_asks_for_ready_domains_again_only_if_one_may_be_ready_again(redis_url):
    """Domains that get their next turn an interval later cannot be ready again in the same
    top-up: one ZRANGEBYSCORE of the domains is enough (and one of the delayed items)."""
    t = RedisTracker.from_url(redis_url, lease_seconds=30)
    t.create_job("j", SPEC, CrawlLimits(default=DomainLimits(interval=60)))
    t.register_worker("host", 1, 10)
    items = [f"http://d{n}.invalid/{k}" for n in range(3) for k in range(2)]
    before = _commands(t.client, "zrangebyscore")
    assert sorted(t.add("j", items).dispatch) == [f"http://d{n}.invalid/0" for n in range(3)]
    assert _commands(t.client, "zrangebyscore") - before == 2


def test_begin_save_hands_over_the_staged_body(tracker_factory):
    """The save reads its body in the begin_save step (in Redis: the same round trip), binary
    bytes as they are, for the live holder and for a stale one (whose late save still counts);
    a body that is gone reads as None; a save that will not run gets no body."""
    t = tracker_factory(lease_seconds=0.3, save_timeout=30)
    bodies = body_reader(t)
    w = new_job(t)
    t.add("j", ["x", "y", "gone"])
    body = bytes(range(256)) + "é".encode("latin-1")  # not UTF-8
    token = lease(t, "x", w)
    assert t.scraped("j", "x", token, body=body).held
    begin = t.begin_save("j", "x", token, w, max_lost=LOST)
    assert (begin.status, begin.body) == (SaveStart.OK, body)
    assert t.complete("j", "x", token).changed
    assert t.begin_save("j", "x", token, w, max_lost=LOST).body is None  # done: nothing to save
    old = lease(t, "y", w)
    assert t.scraped("j", "y", old, body=b"first").held
    t.fail("j", "y", old, "lost it", fault=Fault.LOST, max_retries=3, max_lost=LOST)
    new = lease(t, "y", w)
    stale = t.begin_save("j", "y", old, w, max_lost=LOST)
    assert (stale.status, stale.body) == (SaveStart.STALE, b"first")
    assert t.scraped("j", "y", new, body=b"second").held
    assert t.begin_save("j", "y", new, w, max_lost=LOST).body == b"second"
    token = lease(t, "gone", w)
    assert t.scraped("j", "gone", token, body=b"soon gone").held
    bodies.discard("j", token)
    begin = t.begin_save("j", "gone", token, w, max_lost=LOST)
    assert (begin.status, begin.body) == (SaveStart.OK, None)


def test_reserved_save_depends_on_its_workers_heartbeat(tracker_factory):
    """A save message a worker has prefetched is out of the broker: if that worker vanishes, its
    item is reclaimed within a lease, not after the long save timeout. If it stops cleanly, the
    message goes back to the broker and the item waits for it again."""
    t = tracker_factory(lease_seconds=0.3, save_timeout=60)
    w = new_job(t)
    saver = t.register_worker("h2", 2, 1)
    t.add("j", ["x", "y"])
    tx, ty = lease(t, "x", w), lease(t, "y", w)
    t.scraped("j", "x", tx)
    t.scraped("j", "y", ty)
    assert t.extend("j", ["x", "y"], saver, [("x", tx), ("y", ty + 1000)]) == 1  # y: stale token
    time.sleep(0.2)
    assert t.extend("j", ["x"], saver, [("x", tx)]) == 1
    time.sleep(0.2)
    assert t.maintain("j", max_lost=5).reclaimed == 0  # its holder's heartbeat keeps it
    time.sleep(0.35)
    t.heartbeat(w)
    res = t.maintain("j", max_lost=5)
    assert res.reclaimed == 1 and "x" in res.dispatch
    assert t.stats("j").save_pending == 1  # y still waits for its message
    # A clean stop hands a reserved save back to the broker's wait.
    t.extend("j", ["y"], saver, [("y", ty)])
    assert t.release("j", saver, saves=[("y", ty)]) == 1  # only x, dispatched since its reclaim
    time.sleep(0.35)
    t.maintain("j", max_lost=5)
    assert t.stats("j").save_pending == 1


def test_a_deferred_save_keeps_its_wait_through_its_own_workers_heartbeat(tracker_factory):
    """Found with real workers: the finished save task that deferred (disk full) was still in the
    worker's books at its next heartbeat, whose extend cut the item's wait to one lease; the item
    was reclaimed as lost and downloaded again before its delayed save could run."""
    t = tracker_factory(lease_seconds=0.3, save_timeout=30)
    w = new_job(t)
    t.add("j", ["x"])
    token = lease(t, "x", w)
    t.scraped("j", "x", token)
    assert t.begin_save("j", "x", token, w, max_lost=0).status is SaveStart.OK
    assert t.defer_save("j", "x", token)
    assert t.extend("j", ["x"], w, [("x", token)]) == 1
    time.sleep(0.35)
    t.heartbeat(w)
    assert t.maintain("j", max_lost=0).reclaimed == 0
    assert t.stats("j").save_pending == 1
    assert t.begin_save("j", "x", token, w, max_lost=0).status is SaveStart.OK


def test_pending_save_times_out_as_lost(tracker_factory):
    t = tracker_factory(lease_seconds=0.2, save_timeout=0.3)
    w = new_job(t)
    t.add("j", ["x"])
    token = lease(t, "x", w)
    t.scraped("j", "x", token)
    time.sleep(0.35)
    t.heartbeat(w)
    res = t.maintain("j", max_lost=LOST)
    assert res.reclaimed == 1 and res.dispatch == ["x"]
    # The late save message still completes it.
    assert t.begin_save("j", "x", token, w, max_lost=LOST).status is SaveStart.STALE
    assert t.complete("j", "x").changed


def test_interrupted_saves_count_and_end_dead(tracker_factory):
    """A save whose process dies is delivered again: each interrupted run counts, so a save that
    always kills its worker ends dead with a reason instead of looping."""
    t = tracker_factory(lease_seconds=0.2)
    w = new_job(t)
    t.add("j", ["x"])
    token = lease(t, "x", w)
    t.scraped("j", "x", token)
    results = []
    for _ in range(4):
        results.append(t.begin_save("j", "x", token, w, max_lost=2))
        time.sleep(0.25)  # the run's process died: nobody keeps its lease
    assert [r.status for r in results] == [SaveStart.OK] * 3 + [SaveStart.DEAD]
    assert [r.lost for r in results] == [0, 1, 2, 3]
    assert "interrupted 3 times" in t.dead_items("j")["x"]
    s = t.stats("j")
    assert (s.dead, s.leased, s.save_pending, s.finished) == (1, 0, 0, True)


def test_duplicate_save_while_its_first_run_lives_is_busy(tracker_factory):
    """A save message delivered again while its first run still saves (the broker restored it
    after a connection loss) is not a death: nothing counts, nothing is taken over."""
    t = tracker_factory(lease_seconds=0.3)
    w = new_job(t)
    t.add("j", ["x"])
    token = lease(t, "x", w)
    t.scraped("j", "x", token)
    assert t.begin_save("j", "x", token, w, max_lost=0).status is SaveStart.OK
    for _ in range(3):
        time.sleep(0.15)
        assert t.extend("j", [], w, running=["x"]) == 1  # the first run's heartbeat
        assert t.begin_save("j", "x", token, "w-dup", max_lost=0).status is SaveStart.BUSY
    assert t.complete("j", "x").changed
    assert t.begin_save("j", "x", token, "w-dup", max_lost=0).status is SaveStart.DONE
    assert t.stats("j").dead == 0


def test_defer_save_keeps_the_item_and_counts_nothing(tracker_factory):
    t = tracker_factory(lease_seconds=0.2, save_timeout=30)
    w = new_job(t)
    t.add("j", ["x"])
    token = lease(t, "x", w)
    t.scraped("j", "x", token)
    for _ in range(3):
        assert t.begin_save("j", "x", token, w, max_lost=0).status is SaveStart.OK
        assert t.defer_save("j", "x", token)
        time.sleep(0.25)
        assert t.maintain("j", max_lost=0).reclaimed == 0
    assert t.begin_save("j", "x", token, w, max_lost=0).lost == 0
    assert t.complete("j", "x").changed


def test_pending_saves_hold_dispatch_back_at_a_bound_of_their_own(tracker_factory):
    """Scrape messages and the pages of save messages have bounds of their own: saves at theirs
    hold dispatch back even while there is room for scrape messages."""
    t = tracker_factory(dispatch_factor=1, save_backlog_factor=1)
    w = new_job(t, concurrency=2)  # 2 scrape messages, 2 pages of saves
    assert t.add("j", list("abcdef")).dispatch == ["a", "b"]
    ta = t.checkout("j", "a", w, max_lost=LOST)
    assert ta.dispatch == ["c"]  # "a" left the broker
    assert t.scraped("j", "a", ta.token).dispatch == []  # b, c wait: no room for scrapes
    tb = t.checkout("j", "b", w, max_lost=LOST)
    assert tb.dispatch == ["d"]  # one save pending is under its bound
    assert t.scraped("j", "b", tb.token).dispatch == []
    # "c" leaves the broker, but the two saves pending fill their bound.
    assert t.checkout("j", "c", w, max_lost=LOST).dispatch == []
    assert t.begin_save("j", "a", ta.token, w, max_lost=LOST).dispatch == ["e"]


def test_scrape_messages_are_a_share_of_the_worker_slots_and_at_least_one(tracker_factory):
    t = tracker_factory(dispatch_factor=0.25, save_backlog_factor=3)
    w = new_job(t, concurrency=1)
    assert (t.dispatch_bound(), t.save_bound()) == (1, 3)
    assert t.add("j", list("abcdef")).dispatch == ["a"]
    t.register_worker("h2", 2, 9)
    assert (t.dispatch_bound(), t.save_bound()) == (3, 30)  # 10 / 4, rounded up
    assert t.checkout("j", "a", w, max_lost=LOST).dispatch == ["b", "c", "d"]


def test_release_gives_back_at_once_without_counting(tracker_factory):
    t = tracker_factory(dispatch_factor=1, save_backlog_factor=1)
    w1 = new_job(t, concurrency=3)
    w2 = t.register_worker("h2", 2, 1)
    t.add("j", ["a", "b", "c", "d", "e"])
    ta = lease(t, "a", w1)
    lease(t, "b", w2)
    tc = lease(t, "c", w1)
    t.scraped("j", "c", tc)  # save pending: its message is in the broker, not on w1
    assert t.stats("j").dispatched == 2  # d, e
    # a (leased to w1), and d, e: dispatched items name no worker, and w1 may have taken them for
    # messages it never sent.
    assert t.release("j", w1) == 3
    assert (t.stats("j").frontier, t.stats("j").save_pending) == (3, 1)
    assert t.checkout("j", "a", w2, max_lost=0).failed_attempts == 0
    assert fail(t, "a", ta).outcome is FailOutcome.IGNORED  # w1's token is stale now
    assert t.checkout("j", "d", w2, max_lost=0).status is LeaseStatus.OK  # its message came
    assert t.release("j") == 5  # a, b, d (leased), c (save pending), e (dispatched again)
    s = t.stats("j")
    assert (s.leased, s.save_pending, s.dispatched, s.dead) == (0, 0, 0, 0)
    assert s.queued == 5


def test_release_queues_kept_saves_at_once_and_returns_reserved_ones_to_the_broker(tracker_factory):
    """Found in CI (a worker's process group got SIGTERM): pages its pool processes had kept for
    a save batch they never queued waited the whole save timeout after the worker stopped, as if
    their save messages were coming back from the broker. Only the saves the worker says it had
    reserved wait; a kept one, or one whose token is stale, is queued again at once."""
    t = tracker_factory(save_timeout=600, dispatch_factor=1, save_backlog_factor=1)
    w = new_job(t, concurrency=4)
    other = t.register_worker("h2", 2, 1)
    t.add("j", ["kept", "claimed", "stale", "theirs"])
    tk, tc, ts, tt = (lease(t, i, w) for i in ("kept", "claimed", "stale", "theirs"))
    t.scraped("j", "kept", tk, keep_as=w)  # its batch never went out
    t.scraped("j", "claimed", tc)
    t.scraped("j", "stale", ts, keep_as=w)
    t.scraped("j", "theirs", tt, keep_as=other)
    assert t.extend("j", ["claimed"], w, [("claimed", tc)]) == 1  # its message reached w
    assert t.release("j", w, saves=[("claimed", tc), ("stale", ts + 1000)]) == 2
    s = t.stats("j")
    assert (s.frontier, s.save_pending) == (2, 2), s  # kept and stale queued; claimed and theirs wait
    # The claimed save's message comes back from the broker: its save still runs, once.
    assert t.begin_save("j", "claimed", tc, other, max_lost=LOST).status is SaveStart.OK
    assert t.begin_save("j", "kept", tk, other, max_lost=LOST).status is SaveStart.STALE
    co = t.checkout("j", "kept", other, max_lost=LOST)
    assert co.token not in (None, tk) and co.failed_attempts == 0
    # Its kept "theirs", "claimed" it saves, "kept" it scrapes, and "stale", dispatched when
    # the save of "claimed" left the broker.
    assert t.stats("j").dispatched == 1
    assert t.release("j", other) == 4


def test_item_operations_on_an_unknown_job_are_errors(tracker_factory):
    t = tracker_factory()
    w = new_job(t, job="known")
    for call in (
        lambda: t.add("ghost", ["a"]),
        lambda: t.checkout("ghost", "a", w, max_lost=1),
        lambda: t.scraped("ghost", "a", 1),
        lambda: t.begin_save("ghost", "a", 1, w, max_lost=1),
        lambda: t.complete("ghost", "a"),
        lambda: fail(t, "a", 1, job="ghost"),
        lambda: t.extend("ghost", ["a"], w),
        lambda: t.maintain("ghost", max_lost=1),
        lambda: t.release("ghost"),
        lambda: t.stats("ghost"),
    ):
        with pytest.raises(JobNotFound, match="ghost"):
            call()


def test_expired_dispatch_is_requeued_without_counting(tracker_factory):
    """A message that did not start within a lease: its item is queued again, counted apart
    from the leases reclaimed (nothing vanished that a worker held)."""
    t = tracker_factory(lease_seconds=0.5)
    w = new_job(t, concurrency=1)
    assert t.add("j", ["m"]).dispatch == ["m"]  # its message is lost
    time.sleep(0.6)
    t.heartbeat(w)
    res = t.maintain("j", max_lost=0)
    assert (res.reclaimed, res.died, res.requeued, res.dispatch) == (0, 0, 1, ["m"])
    assert t.checkout("j", "m", w, max_lost=0).failed_attempts == 0


def test_late_duplicate_message_after_reclaim(tracker_factory):
    """A redelivered message for a reclaimed, re-queued item leases it; the fresh one no-ops."""
    t = tracker_factory(lease_seconds=0.5)
    w = new_job(t, concurrency=1)
    t.add("j", ["a", "b"])
    time.sleep(0.6)
    t.heartbeat(w)
    t.maintain("j", max_lost=3)
    lease(t, "b", w)  # b was queued, not dispatched
    t.complete("j", "b")
    s = t.stats("j")
    assert (s.done, s.queued, s.leased) == (1, 1, 0)
    # The stale frontier entry for b is skipped; only a is handed out.
    lease(t, "a", w)
    t.complete("j", "a")
    assert t.stats("j").finished


def test_jobs_specs_and_namespaces(tracker_factory):
    t = tracker_factory()
    assert t.create_job("one", SPEC) is True
    assert t.create_job("one", SPEC) is False
    # Other seeds join the job (its spec keeps the first ones); any other difference is refused,
    # naming the fields.
    assert t.create_job("one", SPEC.replace("http://127.0.0.1/", "http://127.0.0.1/other")) is False
    other = '{"seeds": ["http://127.0.0.1/"], "max_retries": 7}'
    with pytest.raises(JobConflict, match=r"\(max_retries differs\)"):
        t.create_job("one", other)
    with pytest.raises(JobNotFound):
        t.load_spec("missing")
    t.create_job("two", SPEC)
    t.add("one", ["x"])
    t.add("two", ["x", "y"])
    assert t.jobs() == ["one", "two"]
    assert t.load_spec("one") == SPEC
    assert (t.stats("one").seen, t.stats("two").seen) == (1, 2)


def test_large_batches_are_chunked(tracker_factory):
    t = tracker_factory()
    new_job(t, concurrency=1)
    n = MAX_ADD_BATCH * 3 + 7
    res = t.add("j", [f"u{i}" for i in range(n)])
    assert res.added == n and len(res.dispatch) == 2  # the tests' bound: 2 a slot
    assert t.stats("j").queued == n


def test_redis_state_survives_new_tracker_instances(redis_url):
    first = RedisTracker.from_url(redis_url)
    first.create_job("keep", SPEC)
    first.add("keep", ["a", "b"])
    second = RedisTracker.from_url(redis_url)  # e.g. a worker starting: must delete nothing
    assert second.stats("keep").seen == 2
    assert second.add("keep", ["a"]).added == 0


def _race(url, barrier, results, worker_no):
    tracker = RedisTracker.from_url(url)
    barrier.wait()
    # Same order in every process: the most contention per item.
    statuses = {
        item: tracker.checkout("race", item, f"w{worker_no}", max_lost=1).status.value
        for item in [f"item{i}" for i in range(100)]
    }
    results.put((worker_no, statuses))


def test_many_processes_race_for_items_each_leased_once(redis_url):
    tracker = RedisTracker.from_url(redis_url)
    # No in-flight cap for the one domain of these IDs: every item may be leased at once.
    tracker.create_job("race", SPEC, CrawlLimits(default=DomainLimits(concurrency=1000)))
    tracker.add("race", [f"item{i}" for i in range(100)])
    n = 8
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(redis_url, barrier, results, i)) for i in range(n)]
    for p in procs:
        p.start()
    won = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(len(statuses) == 100 for _, statuses in won)  # every process tried every item
    leased = [item for _, statuses in won for item, status in statuses.items() if status == "ok"]
    assert sorted(leased) == sorted(f"item{i}" for i in range(100))  # each exactly once
    others = {status for _, statuses in won for status in statuses.values()} - {"ok"}
    assert others == {"busy"}
    assert tracker.stats("race").leased == 100


def test_add_stream_takes_its_input_batch_by_batch(tracker_factory):
    t = tracker_factory()
    t.create_job("j", SPEC)
    t.add("j", ["x-5", "x-7"])
    pulled = []

    def items():
        for i in range(2_345):
            pulled.append(i)
            yield f"x-{i % 2_000}"

    results = []
    for taken, res in t.add_stream("j", items()):
        results.append((taken, res.added))
        assert len(pulled) <= sum(n for n, _ in results) + 1  # nothing read ahead of a batch
    assert sum(n for n, _ in results) == 2_345
    assert sum(a for _, a in results) == 2_000 - 2
    assert t.stats("j").seen == 2_000


def test_read_ahead_keeps_order_bounds_memory_and_raises_in_place():
    """add_stream reads a seed file's next batch while Redis adds the current one: in order, at
    most two values ahead of the consumer, and an error of the input comes out where it was."""
    import time

    from distscrape_celery.tracker.redis.items import read_ahead

    pulled = []

    def values():
        for i in range(50):
            pulled.append(i)
            yield i
        raise ValueError("line 51 is bad")

    got = []
    with pytest.raises(ValueError, match="line 51"):
        for v in read_ahead(values()):
            time.sleep(0.002)  # a slow consumer: the reader must wait for it
            assert len(pulled) <= v + 3
            got.append(v)
    assert got == list(range(50))

    endless_pulled = []

    def endless():
        for i in range(10**9):
            endless_pulled.append(i)
            yield i

    reader = read_ahead(endless())
    assert next(reader) == 0
    reader.close()  # the consumer stops early: so does the reading
    time.sleep(0.3)
    stopped_at = len(endless_pulled)
    time.sleep(0.3)
    assert len(endless_pulled) == stopped_at <= 3


def test_a_job_deleted_and_made_again_sharded_gets_its_new_keys(redis_url):
    """A tracker builds a job's script keys once; deleting the job forgets them, so a job
    of the same name made again with shards uses each shard's own active marker."""
    from distscrape_celery.tracker.keys import ACTIVE_JOBS, JobKeys

    t = RedisTracker.from_url(redis_url)
    w = new_job(t)
    t.add("j", ["http://a.invalid/"])
    assert lease(t, "http://a.invalid/", w)
    assert t._item_keys("j", 0)[18] == ACTIVE_JOBS
    t.delete_job("j")
    t.create_job("j", SPEC, CrawlLimits(shards=3))
    items = [f"http://h{i}.invalid/" for i in range(12)]
    t.add("j", items)
    for item in items:
        assert lease(t, item, w)
    assert [t._item_keys("j", s)[18] for s in range(3)] == [JobKeys("j", s).active for s in range(3)]


def test_release_of_a_sharded_job_returns_each_shards_reserved_saves(redis_url):
    """release sends each shard's script the pairs of its own items, all in one call: an item it
    is not told about is queued again, so a pair given to the wrong shard would cost a download."""
    t = RedisTracker.from_url(redis_url, save_timeout=600)
    t.create_job("j", SPEC, CrawlLimits(shards=3))
    w = t.register_worker("host", 1, 16)
    items = [f"http://h{i}.invalid/" for i in range(12)]
    t.add("j", items)
    tokens = {item: lease(t, item, w) for item in items}
    for item in items:
        t.scraped("j", item, tokens[item], keep_as=w)
    claimed = items[::2]
    assert len({t._shard_of("j", item) for item in claimed}) == 3
    assert t.release("j", w, saves=[(item, tokens[item]) for item in claimed]) == 6
    s = t.stats("j")
    assert (s.save_pending, s.frontier) == (6, 6), s
    for item in claimed:
        assert t.begin_save("j", item, tokens[item], w, max_lost=LOST).status is SaveStart.OK


def test_unclaimed_saves_are_listed_after_their_age_and_only_they_expire(tracker_factory):
    """A save message a worker took from the broker and died with (ack emulation off) leaves its
    items handed over ("- token") and in no queue. ``unclaimed_saves`` lists the handed-over items
    no worker has taken over, once old enough; ``expire_saves`` ends their wait now, so the next
    maintain reclaims them as lost, not after the save timeout. Only still unclaimed pairs."""
    t = tracker_factory(save_timeout=600)
    w = new_job(t, concurrency=4)
    t.add("j", ["lost", "claimed", "kept"])
    tokens = {i: lease(t, i, w) for i in ("lost", "claimed", "kept")}
    for item, token in tokens.items():
        assert t.scraped("j", item, token, body=b"x", keep_as=w).held
    assert t.handoff("j", w, [("lost", tokens["lost"]), ("claimed", tokens["claimed"])]) == 2
    assert t.unclaimed_saves("j", age=60) == []  # handed over just now
    time.sleep(0.3)
    assert sorted(t.unclaimed_saves("j", age=0.2)) == [("claimed", tokens["claimed"]),
                                                       ("lost", tokens["lost"])]
    assert t.extend("j", [], "w9", [("claimed", tokens["claimed"])], []) == 1  # taken over
    assert t.unclaimed_saves("j", age=0.2) == [("lost", tokens["lost"])]
    assert t.expire_saves("j", [("lost", tokens["lost"] + 1), ("claimed", tokens["claimed"]),
                                ("kept", tokens["kept"])]) == 0  # stale token, claimed, kept
    assert t.expire_saves("j", [("lost", tokens["lost"])]) == 1
    res = t.maintain("j", max_lost=LOST)
    assert res.reclaimed == 1 and t.stats("j").save_pending == 2
    assert t.checkout("j", "lost", w, max_lost=LOST).status is LeaseStatus.OK


# -- the in-memory tracker: the same scripts on a fake Redis of its own --------------------------


def job_keys(client, job="j") -> dict:
    """Every key of ``job`` with its type and value, the job's start and end times and its
    creation ID left out."""
    read = {"hash": client.hgetall, "set": client.smembers, "string": client.get,
            "list": lambda k: client.lrange(k, 0, -1),
            "zset": lambda k: client.zrange(k, 0, -1, withscores=True)}
    out = {}
    for key in client.scan_iter(match=keys.JobKeys(job).pattern):
        kind = client.type(key)
        value = read[kind](key)
        if key == keys.JobKeys(job).control:
            value = {f: v for f, v in value.items() if f not in ("started", "ended", "created")}
        out[key] = (kind, value)
    return out


def test_in_memory_tracker_writes_the_keys_a_real_redis_gets(redis_url):
    """The same calls leave the same keys on the in-memory tracker's fake Redis as on a real
    one: in particular the seen set of done items, whose fingerprints come from redis.sha1hex
    (which the fake server's scripts get from the tracker), and the live-item buckets. Enough
    items that the buckets split; added again, done items are known by their fingerprint and not
    added."""
    items = [f"http://h{i % 3}.invalid/p/{i}" for i in range(380)] + [
        "12345", "http://ä.invalid/ü?x=1", "x" * 3000, ""]
    dumps = []
    for t in (InMemoryTracker(bound_refresh_seconds=0),
              RedisTracker.from_url(redis_url, bound_refresh_seconds=0)):
        w = new_job(t)
        assert t.add("j", items).added == len(items)
        dumps.append({k: v for k, v in job_keys(t.client).items()  # (no times: they differ)
                      if k.startswith(keys.JobKeys("j").item_buckets)})
        token = lease(t, items[0], w)
        assert t.scraped("j", items[0], token, body=b"page").held
        assert t.begin_save("j", items[0], token, w, max_lost=LOST).status is SaveStart.OK
        for item in items:
            assert t.complete("j", item).changed
        assert t.add("j", items).added == 0
        assert t.stats("j").done == len(items)
        dumps.append(job_keys(t.client))
    memory_live, memory, real_live, real = dumps
    latency = keys.JobKeys("j").latency  # lease times: they differ, their domains do not
    assert memory.pop(latency)[1].keys() == real.pop(latency)[1].keys() == {"h0.invalid", "/job"}
    assert len(real_live) > 1  # the live buckets split
    assert memory_live == real_live
    buckets = [k for k in real if k.startswith(keys.JobKeys("j").seen_buckets)]
    assert len(buckets) > 1  # the buckets split
    assert sum(len(real[b][1]) for b in buckets) == len(items)
    assert memory == real


def test_in_memory_tracker_scripts_run_on_its_clock():
    """``clock`` is the scripts' clock (Redis's TIME): heartbeats and leases follow it."""
    now = [5_000_000.0]
    t = InMemoryTracker(lease_seconds=10, bound_refresh_seconds=0, clock=lambda: now[0])
    w = new_job(t)
    assert [x.last_seen for x in t.workers()] == [5_000_000.0]
    t.add("j", ["a"])
    lease(t, "a", w)
    now[0] += 9
    t.heartbeat(w)
    assert t.maintain("j", max_lost=LOST).reclaimed == 0
    now[0] += 2  # the lease of a ran out; w's heartbeat is still fresh
    t.heartbeat(w)
    assert t.maintain("j", max_lost=LOST).reclaimed == 1


def test_in_memory_tracker_is_shared_by_threads():
    """The threads of an in-memory crawl share one tracker: every item is leased once and done
    once, whatever the interleaving of their calls."""
    t = InMemoryTracker(bound_refresh_seconds=0)
    w = new_job(t, concurrency=1000)
    items = [f"http://h{i % 5}.invalid/{i}" for i in range(200)]
    t.add("j", items)
    leased: list[str] = []
    errors: list[BaseException] = []

    def work(mine: list[str]) -> None:
        try:
            for item in mine:
                co = t.checkout("j", item, w, max_lost=LOST)
                if co.status is LeaseStatus.OK:
                    leased.append(item)
                    assert t.scraped("j", item, co.token, body=item.encode()).held
                    begin = t.begin_save("j", item, co.token, w, max_lost=LOST)
                    assert begin.status is SaveStart.OK and begin.body == item.encode()
                    t.complete("j", item, co.token)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    # Each thread takes every item, in its own order: all of them race for each one.
    threads = [threading.Thread(target=work, args=(items[n::-1] + items[n + 1:],))
               for n in range(0, 200, 50)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    assert sorted(leased) == sorted(items)
    s = t.stats("j")
    assert (s.done, s.leased, s.save_pending, s.frontier) == (len(items), 0, 0, 0)


# -- a batch's counters and tokens -------------------------------------------------------------


def _batch(t, name, job, calls, extra_keys=()):
    """Item script ``name`` once per argument list of ``calls``, as one batch call; one reply
    per call."""
    item_keys = list(t._item_keys(job))
    reply, _ = t._eval_many([(name, [*item_keys, *extra_keys], args) for args in calls])
    return reply


def test_a_batch_writes_its_counters_and_tokens_once_and_as_its_calls_would(tracker_factory):
    """Calls in one batch add to the job's counters and take fencing tokens as they would one by
    one: the counts come out the same, every token is new, and a later call's token is above all
    of them (a token handed out twice would let a stale holder's report through)."""
    t = tracker_factory(lease_seconds=30)
    w = new_job(t, concurrency=8)
    items = [f"http://127.0.0.1/p{i}" for i in range(4)]
    t.add("j", items)
    before = lease(t, items[0], w)
    bound, max_batch, lease_s = t._top_up_args("j")
    replies = _batch(t, "checkout", "j", [[item, w, lease_s, bound, max_batch, LOST]
                                          for item in items[1:]])
    tokens = [int(r[3]) for r in replies]
    assert [r[0] for r in replies] == ["ok"] * 3
    assert len(set(tokens)) == 3 and min(tokens) > before
    t.add("j", ["http://127.0.0.1/p0-later"])
    assert lease(t, "http://127.0.0.1/p0-later", w) > max(tokens)
    # Three pages report in one batch; the links found overlap between them and with the job.
    found = [["http://127.0.0.1/a", "http://127.0.0.1/b"], ["http://127.0.0.1/b", items[0]],
             ["http://127.0.0.1/c"]]
    replies = _batch(t, "scraped", "j", [
        [item, token, 60, 1, bound, max_batch, lease_s, "", "", 0, "", "", *links]
        for item, token, links in zip(items[1:], tokens, found)])
    assert [r[0] for r in replies] == ["ok"] * 3
    assert [int(r[1]) for r in replies] == [2, 0, 1]
    s = t.stats("j")
    assert s.seen == 5 + 3
    assert s.frontier + s.dispatched + s.leased + s.save_pending == s.seen - s.done
    done = t.complete_many("j", [(item, token) for item, token in zip(items[1:], tokens)])
    assert all(r.changed for r in done)
    s = t.stats("j")
    assert (s.seen, s.done) == (8, 3)
    assert s.frontier + s.dispatched + s.leased + s.save_pending == s.seen - s.done


def test_a_batch_that_raises_keeps_the_counts_of_what_it_did(tracker_factory):
    """A call that raises ends its batch, but Redis keeps what the calls before it wrote: the
    counters must count it too, or they drift from the items for good."""
    t = tracker_factory(lease_seconds=30)
    w = new_job(t, concurrency=8)
    t.add("j", ["http://127.0.0.1/x"])
    token = lease(t, "http://127.0.0.1/x", w)
    _, max_batch, lease_s = t._top_up_args("j")
    with pytest.raises(redis.exceptions.ResponseError, match="bad dispatch bound"):
        # The batch's one top-up, at its end, is given a bound it cannot read.
        _batch(t, "scraped", "j", [["http://127.0.0.1/x", token, 60, 1, "nonsense", max_batch,
                                    lease_s, "", "", 0, "", "", "http://127.0.0.1/new"]])
    s = t.stats("j")
    assert s.seen == 2
    assert s.frontier + s.dispatched + s.leased + s.save_pending == s.seen - s.done
