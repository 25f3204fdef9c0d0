"""Publishing: a scraped page's messages reach the broker together, in one round trip."""

from __future__ import annotations

import pytest
import redis.connection

from tests.support.crawl import crawl_settings

from distscrape_celery.tracker import Urgent
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.names import SAVE_QUEUE, SCRAPE_QUEUE, SCRAPE_TASK
from distscrape_celery.worker.publish import publisher


def _queued(client) -> tuple[int, int]:
    return client.llen(SCRAPE_QUEUE), client.llen(SAVE_QUEUE)


def test_a_batch_sends_its_scrape_and_save_messages_in_one_round_trip(redis_url, redis_client,
                                                                       monkeypatch):
    configure_app(crawl_settings(redis_url))
    publisher.scrape("j", ["warm"])  # the first publish of each queue declares it
    publisher.save("j", "warm", 1, {})
    before = _queued(redis_client)
    sends = []
    real_send = redis.connection.AbstractConnection.send_packed_command

    def counting_send(self, *args, **kwargs):
        sends.append(1)
        return real_send(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting_send)
    with publisher.batch():
        publisher.scrape("j", ["a", "b", "c"])
        publisher.save("j", "page", 7, {"status": 200})
        assert sends == []  # nothing went out yet
    assert len(sends) == 1
    monkeypatch.undo()
    assert _queued(redis_client) == (before[0] + 3, before[1] + 1)


def test_a_batch_whose_block_raises_sends_nothing(redis_url, redis_client):
    configure_app(crawl_settings(redis_url))
    before = _queued(redis_client)
    with pytest.raises(RuntimeError):
        with publisher.batch():
            publisher.scrape("j", ["a", "b"])
            publisher.save("j", "page", 7, {})
            raise RuntimeError("the page's save could not be prepared")
    assert _queued(redis_client) == before
    publisher.scrape("j", ["after"])  # the thread is out of the batch: sent at once
    assert _queued(redis_client) == (before[0] + 1, before[1])


def test_messages_carry_the_argument_text_flower_shows(redis_url, redis_client):
    """The publisher writes argsrepr itself, Python's repr (Celery's saferepr cost ten times as
    much and says the same but for how a quote inside a string is escaped), cut at Celery's 1024
    characters."""
    import json

    configure_app(crawl_settings(redis_url))
    redis_client.delete(SCRAPE_QUEUE, SAVE_QUEUE)
    long_url = "http://h.example/" + "p" * 2000
    publisher.scrape("j", ["http://h.example/a'b"])
    publisher.scrape("j", [long_url])
    publisher.save("j", "http://h.example/x", 7, {"status": 200, "url": "http://h.example/x"})
    scrapes = [json.loads(m)["headers"] for m in reversed(redis_client.lrange(SCRAPE_QUEUE, 0, -1))]
    save = json.loads(redis_client.lindex(SAVE_QUEUE, 0))["headers"]
    assert scrapes[0]["argsrepr"] == repr(("j", "http://h.example/a'b"))
    assert len(scrapes[1]["argsrepr"]) == 1024 and scrapes[1]["argsrepr"].endswith("...")
    assert save["argsrepr"] == repr(("j", "http://h.example/x", 7,
                                     {"status": 200, "url": "http://h.example/x"}))
    assert all(h["kwargsrepr"] == "{}" for h in [*scrapes, save])


def _decoded(raw: bytes) -> dict:
    import base64
    import json

    message = json.loads(raw)
    assert message["properties"]["body_encoding"] == "base64"  # kombu's Redis transport
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return message


def test_an_urgent_scrape_message_goes_ahead_of_those_waiting(redis_url, redis_client):
    """An Urgent item's message goes to the end of the queue's list that kombu's consumers take
    from, so the next free worker takes it before every message that waited; the others keep
    their order, and the message is the one a plain item gets. Taken here by a kombu consumer on
    the worker's own app and path (BRPOP), so a kombu that took from the other end fails it."""
    from kombu import Consumer

    from distscrape_celery.worker.app import app

    configure_app(crawl_settings(redis_url))
    redis_client.delete(SCRAPE_QUEUE)
    publisher.scrape("j", ["a", "b"])
    with publisher.batch():
        publisher.scrape("j", ["c", Urgent("slow-1"), "d", Urgent("slow-2")])
    taken = []

    def on_message(body, message):
        assert message.headers["task"] == SCRAPE_TASK
        taken.append(body[0][1])
        message.ack()

    with app.connection_for_read() as conn:
        with Consumer(conn, queues=[app.amqp.queues[SCRAPE_QUEUE]], callbacks=[on_message],
                      accept=["json"]) as consumer:
            consumer.qos(prefetch_count=1)
            while len(taken) < 6:
                conn.drain_events(timeout=5)
    assert taken == ["slow-2", "slow-1", "a", "b", "c", "d"]


@pytest.mark.parametrize("delay", [0, 30])
def test_the_publisher_writes_the_message_apply_async_writes(redis_url, redis_client, delay):
    """The publisher builds its messages with Celery's own protocol-2 builder and skips the rest
    of apply_async; a worker (or Flower) must not be able to tell the two apart: same headers
    (parent and root IDs of the task that published it, an ETA for a delayed save), the same
    routing, body and delivery mode."""
    from celery._state import _task_stack

    from distscrape_celery.worker.tasks import save as save_task

    configure_app(crawl_settings(redis_url))
    redis_client.delete(SAVE_QUEUE)
    args = ("j", "http://h.example/x", 7, {"status": 200, "url": "http://h.example/x"})
    save_task.push_request(id="parent-1", root_id="root-1", called_directly=False)
    _task_stack.push(save_task)  # as while a worker runs the task
    try:
        publisher.save(*args, delay=delay)
        save_task.apply_async(args, countdown=delay or None, argsrepr=repr(args), kwargsrepr="{}")
    finally:
        _task_stack.pop()
        save_task.pop_request()
    ours, theirs = (_decoded(m) for m in reversed(redis_client.lrange(SAVE_QUEUE, 0, -1)))
    for message in (ours, theirs):
        message["headers"].pop("id")
        for per_message in ("correlation_id", "delivery_tag"):
            message["properties"].pop(per_message)
        eta = message["headers"].pop("eta")
        assert (eta is not None) == bool(delay)
    # apply_async also copies the argument text into the properties, and names a reply queue
    # for results, which the tasks never keep.
    for extra in ("argsrepr", "kwargsrepr", "reply_to"):
        theirs["properties"].pop(extra)
    assert ours["properties"].pop("reply_to") == ""
    assert ours == theirs
    assert ours["headers"]["parent_id"] == "parent-1" and ours["headers"]["root_id"] == "root-1"
    assert ours["properties"]["delivery_info"] == {"exchange": "", "routing_key": SAVE_QUEUE}
    assert ours["body"][0] == list(args)


def test_the_publisher_declares_a_queue_once_per_connection(redis_url, monkeypatch):
    """kombu would copy and bind the queue for every message only to find it declared already:
    the publisher asks the connection's record first."""
    from kombu import Queue

    configure_app(crawl_settings(redis_url))
    publisher.scrape("j", ["first"])
    declares = []
    real_declare = Queue.declare

    def counting_declare(self, *args, **kwargs):
        declares.append(self.name)
        return real_declare(self, *args, **kwargs)

    monkeypatch.setattr(Queue, "declare", counting_declare)
    copies = []
    real_copy = Queue.__copy__
    monkeypatch.setattr(Queue, "__copy__", lambda self: copies.append(1) or real_copy(self))
    with publisher.batch():
        publisher.scrape("j", ["a", "b"])
    assert declares == [] and copies == []


def test_a_thread_keeps_its_producer_between_batches(redis_url, redis_client, monkeypatch):
    """Celery's producer pool binds a producer to a connection again for every batch; a thread
    keeps its own instead."""
    from kombu import Producer

    configure_app(crawl_settings(redis_url))
    publisher.scrape("j", ["warm"])
    publisher.save("j", "warm", 1, {})
    before = _queued(redis_client)
    revives = []
    real_revive = Producer.revive
    monkeypatch.setattr(Producer, "revive", lambda self, ch: revives.append(1) or real_revive(self, ch))
    for n in range(3):
        with publisher.batch():
            publisher.scrape("j", [f"page-{n}"])
            publisher.save("j", f"page-{n}", n, {})
    assert revives == []
    assert _queued(redis_client) == (before[0] + 3, before[1] + 3)


def test_a_failed_batch_leaves_the_next_one_a_fresh_connection(redis_url, redis_client):
    configure_app(crawl_settings(redis_url))
    publisher.scrape("j", ["warm"])
    first = publisher._kept_producer().producer
    with pytest.raises(RuntimeError):
        with publisher.batch():
            publisher.scrape("j", ["lost"])
            raise RuntimeError("the broker went away mid-batch")
    assert publisher._kept_producer().producer is not first
    before = _queued(redis_client)
    publisher.scrape("j", ["after"])
    assert _queued(redis_client) == (before[0] + 1, before[1])


def test_the_publisher_follows_the_app_to_another_broker(redis_url, redis_client):
    """configure_app (tests, the in-memory crawl) may point the app at another broker: a thread's
    kept producer must not go on publishing to the old one."""
    import redis

    configure_app(crawl_settings(redis_url))
    publisher.scrape("j", ["to-the-first"])
    other_url = redis_url.rsplit("/", 1)[0] + "/7"
    other = redis.Redis.from_url(other_url)
    other.flushdb()
    try:
        configure_app(crawl_settings(redis_url, broker_url=other_url))
        publisher.scrape("j", ["to-the-second"])
        assert other.llen(SCRAPE_QUEUE) == 1
        assert redis_client.llen(SCRAPE_QUEUE) == 1
    finally:
        other.flushdb()
        other.close()
        configure_app(crawl_settings(redis_url))


def _received(queue: str, count: int) -> list:
    """The ``count`` messages waiting in ``queue``, oldest first, taken and decoded by kombu's
    own transport (the app's broker and transport options: a global key prefix too)."""
    from distscrape_celery.worker.app import app

    with app.connection_for_read() as conn:
        channel = conn.default_channel
        messages = [channel.basic_get(queue, no_ack=True) for _ in range(count)]
        assert channel.basic_get(queue, no_ack=True) is None
    assert None not in messages
    return messages


def _fields(message) -> dict:
    """Everything of a received message a worker reads: headers, properties, delivery info,
    content type and encoding, and the decoded body."""
    return {"headers": dict(message.headers), "properties": dict(message.properties),
            "delivery_info": dict(message.delivery_info), "content_type": message.content_type,
            "content_encoding": message.content_encoding, "body": message.decode()}


def _configure(redis_url: str, keyprefix: str = "", **overrides) -> None:
    from distscrape_celery.worker.app import app

    configure_app(crawl_settings(redis_url, **overrides))
    if keyprefix:
        app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                             "global_keyprefix": keyprefix}


@pytest.mark.parametrize("keyprefix", ["", "tenant-a:"])
@pytest.mark.parametrize("in_a_task", [False, True])
def test_a_scrape_message_is_the_message_apply_async_writes(redis_url, redis_client, keyprefix,
                                                            in_a_task):
    """On Redis the publisher fills in a template of the message instead of building each one;
    kombu, decoding both, must find every header, property and the body the same as
    apply_async's (the IDs aside), in the same list, also under the transport's global key
    prefix, and with the parent and root IDs of the task that published it."""
    from celery._state import _task_stack

    from distscrape_celery.worker.tasks import scrape as scrape_task

    try:
        _configure(redis_url, keyprefix)
        args = ("j", "http://h.example/a'b?q=\u00e9")
        if in_a_task:
            scrape_task.push_request(id="parent-1", root_id="root-1", called_directly=False)
            _task_stack.push(scrape_task)
        try:
            publisher.scrape(args[0], [args[1]])
            scrape_task.apply_async(args, argsrepr=repr(args), kwargsrepr="{}")
        finally:
            if in_a_task:
                _task_stack.pop()
                scrape_task.pop_request()
        # Both in the one list kombu's channel names (the prefix is its client's business).
        assert redis_client.llen(keyprefix + SCRAPE_QUEUE) == 2
        if keyprefix:
            assert redis_client.llen(SCRAPE_QUEUE) == 0
        ours, theirs = (_fields(m) for m in _received(SCRAPE_QUEUE, 2))
    finally:
        configure_app(crawl_settings(redis_url))
    for message in (ours, theirs):
        task_id = message["headers"].pop("id")
        assert message["properties"].pop("correlation_id") == task_id
        message["properties"].pop("delivery_tag")
        if not in_a_task:  # a task queued from outside a task is its own root
            assert message["headers"].pop("root_id") == task_id
    # apply_async also copies the argument text into the properties, and names a reply queue
    # for results, which the tasks never keep.
    for extra in ("argsrepr", "kwargsrepr", "reply_to"):
        theirs["properties"].pop(extra)
    assert ours["properties"].pop("reply_to") == ""
    assert ours == theirs
    assert ours["body"] == [list(args), {}, {"callbacks": None, "errbacks": None,
                                             "chain": None, "chord": None}]
    assert ours["headers"]["argsrepr"] == repr(args)
    if in_a_task:
        assert ours["headers"]["parent_id"] == "parent-1"
        assert ours["headers"]["root_id"] == "root-1"


def test_every_message_gets_ids_of_its_own(redis_url, redis_client):
    configure_app(crawl_settings(redis_url))
    publisher.scrape("j", ["a", "b", "c"])
    messages = [_fields(m) for m in _received(SCRAPE_QUEUE, 3)]
    assert [m["body"][0][1] for m in messages] == ["a", "b", "c"]
    assert len({m["headers"]["id"] for m in messages}) == 3
    assert len({m["properties"]["delivery_tag"] for m in messages}) == 3
    assert all(m["headers"]["root_id"] == m["headers"]["id"] for m in messages)


def test_the_message_template_follows_the_app_config_and_the_queue(redis_url, redis_client):
    """A template holds what the app's configuration decides (time limits, the queue): a
    message must not carry what an earlier configuration said."""
    from distscrape_celery.worker.app import app

    try:
        configure_app(crawl_settings(redis_url, task_time_limit=600))
        publisher.scrape("j", ["first"])
        configure_app(crawl_settings(redis_url, task_time_limit=900, queue_prefix="other"))
        publisher.scrape("j", ["second"])
        app.conf.task_time_limit = 1200  # the same broker connection, another time limit
        publisher.scrape("j", ["third"])
        first = _fields(_received(SCRAPE_QUEUE, 1)[0])
        second, third = (_fields(m) for m in _received("other.scrape", 2))
    finally:
        configure_app(crawl_settings(redis_url))
    assert first["headers"]["timelimit"] == [600, 540]
    assert second["headers"]["timelimit"] == [900, 810]
    assert third["headers"]["timelimit"] == [1200, 810]
    assert first["delivery_info"]["routing_key"] == SCRAPE_QUEUE
    assert second["delivery_info"]["routing_key"] == "other.scrape"
    assert [m["body"][0][1] for m in (first, second, third)] == ["first", "second", "third"]


def test_a_forked_process_publishes_with_a_template_of_its_own(redis_url, redis_client):
    """The origin header names the publishing process: a child forked after the parent
    published must not send the parent's template."""
    import os
    import socket

    configure_app(crawl_settings(redis_url))
    publisher.scrape("j", ["parent"])
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            publisher.scrape("j", ["child"])
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    publisher.scrape("j", ["parent-again"])
    messages = [_fields(m) for m in _received(SCRAPE_QUEUE, 3)]
    origins = {m["body"][0][1]: m["headers"]["origin"] for m in messages}
    host = socket.gethostname()
    assert origins == {"parent": f"gen{os.getpid()}@{host}", "child": f"gen{pid}@{host}",
                       "parent-again": f"gen{os.getpid()}@{host}"}


def test_a_redis_client_that_retries_keeps_kombus_own_publishing(redis_url, redis_client):
    """A client that retries a timed-out command could send a pipeline twice: kombu does not
    batch there, and neither does the publisher's template path, which needs a pipeline."""
    from distscrape_celery.worker.app import app

    try:
        configure_app(crawl_settings(redis_url))
        app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                             "retry_on_timeout": True}
        assert publisher._kept_producer().redis is None
        publisher.scrape("j", ["a", "b"])
        assert [_fields(m)["body"][0][1] for m in _received(SCRAPE_QUEUE, 2)] == ["a", "b"]
    finally:
        configure_app(crawl_settings(redis_url))
    assert publisher._kept_producer().redis is not None


def test_a_batch_for_two_lists_goes_to_the_prefixed_lists(redis_url, redis_client):
    """A batch for more than one list goes out as a pipeline: the transport's global key prefix
    must reach its commands as it reaches a single LPUSH."""
    try:
        _configure(redis_url, "tenant-a:")
        with publisher.batch():
            publisher.scrape("j", ["a", "b"])
            publisher.save("j", "page", 7, {})
        assert redis_client.llen("tenant-a:" + SCRAPE_QUEUE) == 2
        assert redis_client.llen("tenant-a:" + SAVE_QUEUE) == 1
        assert _queued(redis_client) == (0, 0)
        assert [_fields(m)["body"][0][1] for m in _received(SCRAPE_QUEUE, 2)] == ["a", "b"]
        assert _fields(_received(SAVE_QUEUE, 1)[0])["body"][0][:3] == ["j", "page", 7]
    finally:
        configure_app(crawl_settings(redis_url))


def test_a_queue_that_expires_keeps_kombus_own_publishing(redis_url, redis_client, monkeypatch):
    """kombu follows each message to a queue with an expiry with a PEXPIRE of the queue's lists;
    the template path does not, so such an app keeps kombu's path (none of ours expires)."""
    from distscrape_celery.worker.app import app

    configure_app(crawl_settings(redis_url))
    monkeypatch.setattr(app.amqp.queues[SCRAPE_QUEUE], "expires", 600.0)
    publisher._drop_kept_producer()
    try:
        assert publisher._kept_producer().redis is None
        with publisher.batch():
            publisher.scrape("j", ["a"])
            publisher.save("j", "page", 7, {})
        assert _queued(redis_client) == (1, 1)
        assert 0 < redis_client.pttl(SCRAPE_QUEUE) <= 600_000
    finally:
        monkeypatch.undo()
        publisher._drop_kept_producer()
