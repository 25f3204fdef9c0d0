"""The kombu fix that keeps a worker alive through a Redis restart, at the level of its cause."""

from __future__ import annotations

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
