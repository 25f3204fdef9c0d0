"""The kombu fix that keeps a worker alive through a Redis restart, at the level of its cause."""

from __future__ import annotations

import redis
from kombu import Connection, Exchange, Queue

from distscrape_celery import kombu_fixes


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
