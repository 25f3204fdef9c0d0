"""RedisTracker's item scripts run on a connection each thread keeps (redis-py's pool
and command layers cost about as much client CPU as the round trip). Kept connections must be
as safe as pooled ones: a connection the server closed is made again before it is used, a call
cut off mid-reply never leaves its late reply for the next call, a forked child never talks on
its parent's socket, and a flushed script cache is refilled. Real Redis servers throughout.
"""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest
import redis

from distscrape_celery.local.embedded import EmbeddedRedis
from distscrape_celery.errors import TrackerUnavailable
from distscrape_celery.tracker import LeaseStatus, RedisTracker
from tests.support.jobs import SPEC

NAME = "kept-connection-test"


def _tracker(url: str, **client_kw) -> RedisTracker:
    client = redis.Redis.from_url(url, decode_responses=True, client_name=NAME, **client_kw)
    return RedisTracker(client, bound_refresh_seconds=0)


def _job(tracker: RedisTracker, items: list[str]) -> str:
    """A job with ``items`` dispatched (as the broker would deliver them; at most the
    per-domain cap of each domain), and a worker id."""
    tracker.create_job("j", SPEC)
    wid = tracker.register_worker("host", 1, 1000)
    tracker.add("j", items)
    return wid


def test_a_kept_connection_the_server_closed_is_made_again(redis_url, redis_client):
    tracker = _tracker(redis_url)
    wid = _job(tracker, ["a", "b"])
    assert tracker.checkout("j", "a", wid, max_lost=3).status is LeaseStatus.OK
    ours = [c for c in redis_client.client_list() if c["name"] == NAME]
    assert ours
    for c in ours:  # as a restart, an idle timeout or a proxy would
        redis_client.client_kill_filter(_id=c["id"])
    # The next call still goes through, on a new connection, as with redis-py's pool.
    assert tracker.checkout("j", "b", wid, max_lost=3).status is LeaseStatus.OK


def test_a_call_cut_off_by_a_timeout_leaves_nothing_for_the_next_call():
    with EmbeddedRedis() as server:
        tracker = _tracker(server.url, socket_timeout=0.3)
        wid = _job(tracker, ["a", "z"])
        other = tracker.register_worker("other", 2, 1)
        # Connected first (the call below must be sent, not stuck in the connect handshake),
        # and "z" done, so that a checkout of it is answered "done".
        co = tracker.checkout("j", "z", wid, max_lost=3)
        assert tracker.complete("j", "z", co.token).changed
        # A script that holds the server for a second, as a slow command or a frozen Redis
        # would: our call goes out, and its reply comes after we gave up on it.
        busy = threading.Thread(target=redis.Redis.from_url(server.url).eval, args=(
            "local t = redis.call('TIME') local n = t "
            "while (n[1] - t[1]) * 1000000 + (n[2] - t[2]) < 1000000 do n = redis.call('TIME') end",
            0))
        busy.start()
        probe = redis.Redis.from_url(server.url, socket_timeout=0.05)
        try:
            while True:  # until the script holds the server
                try:
                    probe.ping()
                except redis.TimeoutError:
                    break
            with pytest.raises(TrackerUnavailable):
                tracker.checkout("j", "a", wid, max_lost=3)
        finally:
            busy.join()
        # Had the call that timed out stayed on its connection, its late reply ("ok") would be
        # read as the answer to this one.
        assert tracker.checkout("j", "z", other, max_lost=3).status is LeaseStatus.DONE


def _lease_and_complete(tracker: RedisTracker, wid: str, item: str) -> str:
    """Two item scripts; the slot the lease took is free again after (politeness limits)."""
    co = tracker.checkout("j", item, wid, max_lost=3)
    done = tracker.complete("j", item, co.token) if co.status is LeaseStatus.OK else None
    return f"{co.status.value} {done.changed if done else '-'}"


def _child_checkouts(tracker: RedisTracker, wid: str, items: list[str], go, out) -> None:
    try:
        go.wait(30)
        results = [_lease_and_complete(tracker, wid, item) for item in items]
        # The connection this thread keeps now, and whose socket it is.
        out.put((results, tracker._local.conn.pid == os.getpid()))
    except Exception as exc:  # reported to the parent
        out.put((repr(exc), None))


def test_a_forked_child_does_not_use_its_parents_kept_connection(redis_url):
    tracker = _tracker(redis_url)
    parent_items = [f"http://p{i}.example.invalid/" for i in range(300)]
    child_items = [f"http://c{i}.example.invalid/" for i in range(300)]
    wid = _job(tracker, parent_items + child_items)
    assert _lease_and_complete(tracker, wid, parent_items[0]) == "ok True"  # a kept connection
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_child_checkouts, args=(tracker, wid, child_items, go, out))
    child.start()
    go.set()
    # Both talk at once: on one shared socket their replies would cross.
    mine = [_lease_and_complete(tracker, wid, item) for item in parent_items[1:]]
    theirs, own_connection = out.get(timeout=60)
    child.join(30)
    assert mine == ["ok True"] * len(parent_items[1:])
    assert theirs == ["ok True"] * len(child_items)
    assert own_connection  # made in the child, not inherited from the parent


def test_each_thread_keeps_its_own_connection(redis_url, redis_client):
    tracker = _tracker(redis_url)
    items = [f"http://i{n}.example.invalid/" for n in range(400)]
    wid = _job(tracker, items)
    results: dict[int, list[str]] = {}

    def work(n: int) -> None:
        results[n] = [_lease_and_complete(tracker, wid, item) for item in items[n::8]]

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == ["ok True"] * 50 for r in results.values()), results
    assert len([c for c in redis_client.client_list() if c["name"] == NAME]) >= 8


def test_a_flushed_script_cache_is_loaded_again(redis_url, redis_client):
    tracker = _tracker(redis_url)
    wid = _job(tracker, ["a", "b"])
    assert tracker.checkout("j", "a", wid, max_lost=3).status is LeaseStatus.OK
    redis_client.script_flush()  # as a restarted Redis without the scripts would be
    assert tracker.checkout("j", "b", wid, max_lost=3).status is LeaseStatus.OK


class _CountingSocket:
    """A socket that counts the writes made on it."""

    def __init__(self, sock) -> None:
        self._sock, self.writes = sock, 0

    def sendall(self, data) -> None:
        self.writes += 1
        self._sock.sendall(data)

    def __getattr__(self, name):
        return getattr(self._sock, name)


def test_a_call_with_a_body_goes_out_in_one_write(redis_url):
    """redis-py writes each value over 6,000 bytes on its own, and Redis then often reads the
    request in several reads, each a turn of its event loop: a page's body and the call it
    rides with go out as one write."""
    tracker = _tracker(redis_url)
    wid = _job(tracker, ["http://b.example.invalid/"])
    co = tracker.checkout("j", "http://b.example.invalid/", wid, max_lost=3)
    conn = tracker._thread_connection()
    counting = conn._sock = _CountingSocket(conn._sock)
    body = b"x" * 50_000
    assert tracker.scraped("j", "http://b.example.invalid/", co.token, body=body).held
    assert counting.writes == 1
    [begin] = tracker.begin_saves("j", [("http://b.example.invalid/", co.token)], wid, max_lost=3)
    assert begin.body == body
