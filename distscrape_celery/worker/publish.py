"""The publisher of our task messages: what ``apply_async`` would send, made at a fraction of its
cost, and sent in batches of one broker round trip (:class:`CeleryPublisher`). The process's one
publisher is :data:`publisher`; the scrape pipeline, the worker's agent and the CLI's seeding all
publish through it."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from json.encoder import encode_basestring_ascii
from typing import NamedTuple, Optional

from celery.utils.nodenames import anon_nodename
from celery.utils.time import add_seconds_to_datetime, maybe_make_aware
from kombu import Producer, serialization
from kombu.entity import maybe_delivery_mode
from kombu.transport import redis as kombu_redis
from kombu.utils.json import JSONEncoder
from kombu.utils.json import dumps as json_dumps
from kombu.utils.uuid import uuid

from ..tracker.model import Urgent
from .app import app, current_settings
from .names import SAVE_BATCH_TASK, SAVE_TASK, SCRAPE_TASK


class _KeptProducer(NamedTuple):
    """A thread's kept producer, and what it was made for: the app's connection pool (replaced
    by configure_app) and the process (a fork must not share its connection). ``redis`` is its
    fast path when the broker is kombu's Redis transport."""

    pool: object
    pid: int
    producer: Producer
    redis: Optional["_RedisSender"]


class _Template(NamedTuple):
    """One task's messages to one queue as kombu's Redis transport writes them, with a
    ``str.format`` field for each value that differs between messages: ``text`` is the whole
    message's JSON, ``body`` the body's JSON (before kombu's body encoding)."""

    key: str  # the list it goes to
    text: str
    body: str
    body_encoding: Optional[str]


# Stands for a per-message value while a template is built, and is cut out of the JSON after.
_SLOT = "distscrape-slot-{}-"
_SLOTS = ("id", "root_id", "parent_id", "argsrepr", "eta", "correlation_id", "delivery_tag",
          "body")


# What kombu's json.dumps writes, without making an encoder for every value.
_ENCODER = JSONEncoder()


def _json_text(value: Optional[str]) -> str:
    return "null" if value is None else encode_basestring_ascii(value)


def _format_slots(text: str, names) -> str:
    """``text`` as a format string, each ``"<slot>"`` in it (JSON-quoted) a field."""
    text = text.replace("{", "{{").replace("}", "}}")
    for name in names:
        quoted = json_dumps(_SLOT.format(name))
        if text.count(quoted) != 1:
            raise RuntimeError(f"message template: {name} is not in one place")
        text = text.replace(quoted, "{" + name + "}")
    return text


class _RedisSender:
    """Publishes to kombu's Redis transport without redoing, message by message, what is the
    same for all of them: Celery's message builder and kombu's producer, serializer and channel
    were about an eighth of a crawling worker's CPU (docs/performance.md).

    Each task's messages to a queue share a template, built once per sender (so per thread,
    process and broker connection) by Celery and kombu themselves, with a mark in every field
    that differs; a message fills those in. kombu still decides what is its business: the list
    (the channel's key for the message's priority; the channel's client adds the transport's
    global key prefix), the body encoding, the delivery tags. A batch's messages go out in one
    pipeline when it ends, as kombu's publish batch would send them.
    """

    def __init__(self, producer: Producer, channel) -> None:
        self.producer, self.channel = producer, channel
        self._templates: dict[tuple, _Template] = {}

    @classmethod
    def for_producer(cls, producer: Producer) -> Optional["_RedisSender"]:
        """A sender for the producer's broker; None unless it is kombu's Redis transport and
        kombu would batch there (not when the client retries a timed-out command: a pipeline
        could be sent twice), and no queue of the app expires (kombu follows each message to
        such a queue with commands of its own)."""
        channel = producer.channel
        if not isinstance(channel, kombu_redis.Channel) or not channel.supports_batch_publish:
            return None
        if any(q.expires is not None or "x-expires" in (q.queue_arguments or {})
               for q in app.amqp.queues.values()):
            return None
        return cls(producer, channel)

    def template(self, name: str, queue: str, origin: str) -> _Template:
        """The template of task ``name``'s messages to ``queue``, for the app's current
        configuration."""
        conf = app.conf
        spec = (name, queue, origin, conf.task_time_limit, conf.task_soft_time_limit,
                conf.task_default_delivery_mode)
        try:
            return self._templates[spec]
        except KeyError:
            template = self._templates[spec] = self._build(name, queue, origin)
            return template

    def _build(self, name: str, queue: str, origin: str) -> _Template:
        channel, conf = self.channel, app.conf
        slot = {field: _SLOT.format(field) for field in (*_SLOTS, "args")}
        # What CeleryPublisher's kombu path does, step by step, with marks for the values.
        headers, properties, body, _ = app.amqp.as_task_v2(
            slot["id"], name, (), None, root_id=slot["root_id"], parent_id=slot["parent_id"],
            ignore_result=True, origin=origin, time_limit=conf.task_time_limit,
            soft_time_limit=conf.task_soft_time_limit, argsrepr=slot["argsrepr"],
            kwargsrepr="{}",
        )
        headers["eta"] = slot["eta"]
        properties["correlation_id"] = slot["correlation_id"]
        properties["delivery_mode"] = maybe_delivery_mode(
            conf.task_default_delivery_mode or self.producer.exchange.delivery_mode)
        content_type, content_encoding, _ = serialization.dumps(body, serializer="json")
        message = channel.prepare_message("", 0, content_type, content_encoding, headers,
                                          properties)
        channel._inplace_augment_message(message, "", queue)
        body_encoding = message["properties"]["body_encoding"]
        message["body"] = slot["body"]
        message["properties"]["delivery_tag"] = slot["delivery_tag"]
        key = channel._q_for_pri(queue, channel._get_message_priority(message, reverse=False))
        return _Template(
            key, _format_slots(json_dumps(message), _SLOTS),
            _format_slots(json_dumps((slot["args"], *body[1:])), ["args"]), body_encoding,
        )

    def message(self, template: _Template, args: tuple, task_id: str, root_id: Optional[str],
                parent_id: Optional[str], eta: Optional[str]) -> str:
        """The JSON of one message, as kombu's Redis transport would write it."""
        body = template.body.format(args=_ENCODER.encode(args))
        encoded, _ = self.channel.encode_body(body, template.body_encoding)
        quoted_id = encode_basestring_ascii(task_id)
        return template.text.format(
            id=quoted_id, correlation_id=quoted_id, root_id=_json_text(root_id or task_id),
            parent_id=_json_text(parent_id), argsrepr=_json_text(_args_text(args)),
            eta=_json_text(eta), delivery_tag=_json_text(self.channel._next_delivery_tag()),
            body=_ENCODER.encode(encoded),
        )

    def send(self, messages: Sequence[tuple[str, str, bool]]) -> None:
        """Push the ``(key, message, ahead)`` triples in order, in one round trip: LPUSH, or
        RPUSH for a message ``ahead`` of those waiting (kombu's consumers pop from the right). A
        run of messages to one end of one list is one command, and more than one command go in
        a pipeline."""
        runs: list[tuple[str, bool, list[str]]] = []
        for key, message, ahead in messages:
            if runs and runs[-1][0] == key and runs[-1][1] == ahead:
                runs[-1][2].append(message)
            else:
                runs.append((key, ahead, [message]))
        with self.channel.conn_or_acquire() as client:
            if len(runs) == 1:
                key, ahead, run = runs[0]
                (client.rpush if ahead else client.lpush)(key, *run)
                return
            with client.pipeline(transaction=False) as pipe:
                for key, ahead, run in runs:
                    (pipe.rpush if ahead else pipe.lpush)(key, *run)
                pipe.execute()


class CeleryPublisher:
    """Publishes our tasks. Inside :meth:`batch`, every message this thread publishes goes to the
    broker in one round trip when the block ends; if the block raises, none of it is sent.

    Each message is the one ``apply_async`` would write (protocol 2: the same headers, parent and
    root IDs, body, delivery mode), on the default exchange with the queue's name as routing key,
    which is where ``apply_async`` routes a direct queue too. How it is made depends on the
    broker:

    - kombu's Redis transport (``redis://``, ``rediss://``, a global key prefix or not): each
      task's messages to a queue share a template of the JSON kombu would write, made once per
      thread's connection by Celery and kombu themselves; a message only fills in its IDs,
      arguments, argument text, ETA and delivery tag (:class:`_RedisSender`). The batch is one
      Redis pipeline of LPUSHes (one LPUSH for one list). This cut the CPU of publishing a batch
      of 8 messages by about 70 % (docs/performance.md, "Publishing").
    - any other broker (AMQP), a Redis client set to retry timed-out commands (a pipeline could
      then be sent twice; kombu does not batch there either), and an app with a queue that
      expires: Celery builds each message (``app.amqp.as_task_v2``) and kombu's producer
      publishes it in kombu's publish batch.

    Either way it skips, of ``apply_async``: Celery's router and option merging, the
    ``before/after_task_publish`` signals (nothing here listens), publish retries (a batch sends
    nothing until it ends), a ``reply_to`` for results that are never kept, and kombu copying and
    binding the queue for every message only to find it declared already.
    """

    def __init__(self) -> None:
        # Per thread (threads pool): the open batch's producer, and the producer the thread keeps.
        self._local = threading.local()
        self._origin: tuple[int, str] = (0, "")

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Publish what is published in the block together at its end; if the block raises,
        nothing of it is sent. Raises what the broker raised when the batch is sent."""
        local = self._local
        if getattr(local, "producer", None) is not None:
            yield  # nested: the outer batch sends it all
            return
        kept = self._kept_producer()
        try:
            if kept.redis is not None:
                pending: list[tuple[str, str, bool]] = []
                local.producer, local.redis, local.pending = kept.producer, kept.redis, pending
                try:
                    yield
                finally:
                    local.producer = local.redis = local.pending = None
                if pending:
                    kept.redis.send(pending)
                return
            with kept.producer.batch():
                local.producer, local.redis = kept.producer, None
                try:
                    yield
                finally:
                    local.producer = None
        except BaseException:
            # Its connection may be broken: the thread's next batch starts on a new one.
            self._drop_kept_producer()
            raise

    def _kept_producer(self) -> _KeptProducer:
        """This thread's producer on a broker connection of its own, kept between batches.

        Celery's producer pool would hand out a producer per batch and bind it to a connection
        again each time (a third of the cost of publishing, docs/performance.md). The cost of keeping
        one: a broker connection per publishing thread. It is rebuilt after a fork, and when
        :func:`~.app.configure_app` replaced the app's connections (another broker).
        """
        pool, pid = app.pool, os.getpid()
        kept = getattr(self._local, "kept", None)
        if kept is not None and kept.pool is pool and kept.pid == pid:
            return kept
        self._drop_kept_producer()
        producer = app.amqp.Producer(app.connection_for_write())
        try:
            redis = _RedisSender.for_producer(producer)
        except BaseException:
            with contextlib.suppress(Exception):
                producer.connection.close()
            raise
        kept = self._local.kept = _KeptProducer(pool, pid, producer, redis)
        return kept

    def _drop_kept_producer(self) -> None:
        kept, self._local.kept = getattr(self._local, "kept", None), None
        if kept is not None and kept.pid == os.getpid():  # a forked child leaves its parent's be
            with contextlib.suppress(Exception):
                kept.producer.connection.close()

    def scrape(self, job: str, items: Sequence[str]) -> None:
        """Queue a scrape task for each of ``items``; on the Redis broker an :class:`Urgent` one
        goes ahead of the messages waiting (elsewhere all go in the order given)."""
        with self.batch():
            queue = current_settings().scrape_queue
            # Only kombu's Redis transport has a head of the queue: elsewhere the order given.
            ahead = ([item for item in items if isinstance(item, Urgent)]
                     if self._local.redis is not None else [])
            in_line = [item for item in items if not isinstance(item, Urgent)] if ahead else items
            self._send(SCRAPE_TASK, queue, [(job, item) for item in in_line])
            self._send(SCRAPE_TASK, queue, [(job, item) for item in ahead], ahead=True)

    def save(self, job: str, item: str, token: int, meta: dict, delay: float = 0) -> None:
        with self.batch():
            self._send(SAVE_TASK, current_settings().save_queue, [(job, item, token, meta)],
                       countdown=delay or None)

    def save_batch(self, job: str, saves: Sequence[tuple[str, int, dict]]) -> None:
        with self.batch():
            self._send(SAVE_BATCH_TASK, current_settings().save_queue,
                       [(job, [list(entry) for entry in saves])])

    def _send(self, name: str, queue: str, messages: Sequence[tuple],
              countdown: Optional[float] = None, ahead: bool = False) -> None:
        """Publish a message of task ``name`` to ``queue`` for each of the arguments
        ``messages`` (inside a batch); ``ahead`` of those waiting, where the broker allows it."""
        if not messages:
            return
        local, conf = self._local, app.conf
        producer, redis = local.producer, local.redis
        parent_id = root_id = None
        parent = app.current_worker_task
        if parent is not None:  # Flower shows the task that queued this one
            parent_id = parent.request.id
            root_id = parent.request.root_id or parent_id
        queue_obj = app.amqp.queues[queue]
        # kombu keeps what a connection declared (and forgets it on reconnect): declare the queue
        # once per connection, as apply_async would (AMQP brokers need it before use; kombu's
        # Redis transport routes by the binding it records).
        if hash(queue_obj) not in producer.connection.declared_entities:
            producer.maybe_declare(queue_obj)
        if redis is not None:
            template = redis.template(name, queue, self._origin_name())
            eta = None
            if countdown:  # as Celery's as_task_v2 turns a countdown into an ETA
                eta = maybe_make_aware(add_seconds_to_datetime(app.now(), countdown),
                                       tz=app.timezone).isoformat()
            local.pending.extend(
                (template.key, redis.message(template, args, uuid(), root_id, parent_id, eta),
                 ahead)
                for args in messages)
            return
        for args in messages:
            headers, properties, body, _ = app.amqp.as_task_v2(
                uuid(), name, args, None, countdown=countdown, root_id=root_id,
                parent_id=parent_id, ignore_result=True, origin=self._origin_name(),
                time_limit=conf.task_time_limit, soft_time_limit=conf.task_soft_time_limit,
                argsrepr=_args_text(args), kwargsrepr="{}",
            )
            producer.publish(
                body, exchange="", routing_key=queue, serializer="json", headers=headers,
                delivery_mode=conf.task_default_delivery_mode, retry=False, **properties,
            )

    def _origin_name(self) -> str:
        """Celery's ``origin`` header (``gen<pid>@<host>``), computed once per process."""
        pid = os.getpid()
        if self._origin[0] != pid:
            self._origin = (pid, anon_nodename())
        return self._origin[1]


# The arguments' text that Flower shows: Python's repr, at a tenth of the cost of Celery's saferepr
# per message, and the same text for our arguments (strings, numbers, a flat dict) but for how a
# quote inside a string is escaped.
_REPR_MAX = 1024  # Celery's own limit (amqp.argsrepr_maxsize)


def _args_text(args: tuple) -> str:
    text = repr(args)
    if len(text) > _REPR_MAX:
        text = text[:_REPR_MAX - 3] + "..."
    return text


publisher = CeleryPublisher()
