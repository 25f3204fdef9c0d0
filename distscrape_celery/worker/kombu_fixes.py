"""Three fixes to kombu's Redis transport: a worker rides out a Redis restart, a publish does
not build a new Redis client, and a consumer with room for several messages fetches them in one
round trip.

The crash: when the broker connection drops, Celery's consumer calls ``connection.collect()``,
which drops the transport's reference to its ``Connection`` (``transport.client = None``). A
channel that still holds unacknowledged messages (late acknowledgement: every running task's) is
closed after that, and closing it restores those messages, which needs a new Redis client, whose
parameters kombu reads from ``transport.client``: ``AttributeError: 'NoneType' object has no
attribute 'hostname'`` from ``QoS.restore_unacked`` -> ``Channel._connparams``. An AttributeError
is not a connection error, so Celery calls it unrecoverable and the worker exits. The same crash
is reported upstream in celery/kombu#582 and #970 (channel close after the connection's transport
was torn down); kombu 5.7.0 still has it.

The fix: each Redis channel remembers its connection's parameters when it is created, and uses
them when the transport has already forgotten them. The restore then connects as usual; if Redis
is still down, it fails with a connection error, which Celery handles (and the messages stay in
Redis's ``unacked`` hash, which kombu restores after the visibility timeout; the tracker recovers
their items within a lease anyway).

The cost: every publish batch (and every other command a channel sends outside its consumer) asks
``Channel._create_client()`` for a new ``redis.Redis``, whose constructor fills a table of ~170
response callbacks: about a tenth of the CPU of publishing a page's messages. The fix: each
channel keeps one synchronous client per connection pool (a ``redis.Redis`` is thread-safe; its
connections come from the pool, as before) and builds a new one only when the channel's pool was
replaced, as after a reconnect.

The round trips: kombu fetches each message with a BRPOP of its own, one round trip a message,
even when the consumer has room for several (a threads worker whose threads finished pages
while its event loop was busy). A round trip costs Redis tens of microseconds of CPU, most of it
in the kernel, against about one for the pop itself (docs/performance.md, "What a page's Redis
work is made of"). The fix: on Redis 7 or later, when the consumer has room for more than one
message, the channel sends ``BLMPOP timeout numkeys keys... RIGHT COUNT room`` instead, which
pops up to that many from the first non-empty queue in the order BRPOP would look (and blocks
like it when all are empty), and delivers each. With room for one, or on an older Redis (the
channel asks the server's version once), it sends BRPOP as before. Nothing else changes: the
prefetch limit (a worker takes no more than it has room for), ack emulation's bookkeeping (per
delivered message), the order of the queues.
"""

from __future__ import annotations

import logging
from queue import Empty
from time import monotonic

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from redis.exceptions import ResponseError

log = logging.getLogger(__name__)

_MARK = "_distscrape_patched"
# The first Redis with BLMPOP.
_BLMPOP_SINCE = (7, 0)


def _server_has_blmpop(channel) -> bool:
    """Whether the channel's Redis has BLMPOP (asked once per channel, on a pool connection:
    the consumer's own connection may have a BRPOP in flight)."""
    known = getattr(channel, "_distscrape_blmpop", None)
    if known is None:
        try:
            version = str(channel._create_client().info("server")["redis_version"])
            known = tuple(int(x) for x in version.split(".")[:2]) >= _BLMPOP_SINCE
        except Exception:  # a proxy that hides INFO, say: BRPOP works everywhere
            known = False
        channel._distscrape_blmpop = known
    return known


def apply() -> None:
    """Patch kombu's Redis ``Channel`` (idempotent)."""
    channel_cls = kombu_redis.Channel
    if getattr(channel_cls, _MARK, False):
        return
    _remember_connection(channel_cls)
    _keep_one_client(channel_cls)
    _start_blmpop(channel_cls)
    _read_blmpop(channel_cls)
    setattr(channel_cls, _MARK, True)


def _remember_connection(channel_cls) -> None:
    """The crash: a channel keeps its connection's parameters from its creation, and uses them
    when the transport has already forgotten them."""
    original_init = channel_cls.__init__
    original_connparams = channel_cls._connparams

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._distscrape_conninfo = self.connection.client

    def _connparams(self, asynchronous=False):
        transport = self.connection
        saved = getattr(self, "_distscrape_conninfo", None)
        if transport.client is None and saved is not None:
            transport.client = saved
            try:
                return original_connparams(self, asynchronous)
            finally:
                transport.client = None
        return original_connparams(self, asynchronous)

    channel_cls.__init__ = __init__
    channel_cls._connparams = _connparams


def _keep_one_client(channel_cls) -> None:
    """The cost: a channel keeps one synchronous client per connection pool."""
    original_create_client = channel_cls._create_client

    def _create_client(self, asynchronous=False):
        if asynchronous:
            return original_create_client(self, asynchronous)
        client = getattr(self, "_distscrape_client", None)
        if client is None or client.connection_pool is not self.pool:
            client = self._distscrape_client = original_create_client(self, asynchronous)
        return client

    channel_cls._create_client = _create_client


def _start_blmpop(channel_cls) -> None:
    """The round trips, sending: a consumer with room for more than one message on Redis 7 or
    later sends BLMPOP for up to that many, and marks the channel so that the read that follows
    expects its reply (:func:`_read_blmpop`); otherwise BRPOP, as kombu would."""
    original_brpop_start = channel_cls._brpop_start

    def _brpop_start(self, timeout=None):
        self._distscrape_many = False
        room = self.qos.can_consume_max_estimate()
        if not room or room < 2 or not _server_has_blmpop(self):
            return original_brpop_start(self, timeout)
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        keys = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        if self.global_keyprefix:
            keys = [self.global_keyprefix + key for key in keys]
        self._in_poll = self.client.connection
        self._brpop_sent_at = monotonic()
        self._distscrape_many = True
        self.client.connection.send_command(
            "BLMPOP", timeout or 0, len(keys), *keys, "RIGHT", "COUNT", room)

    channel_cls._brpop_start = _brpop_start


def _read_blmpop(channel_cls) -> None:
    """The round trips, reading: the reply of a BLMPOP that :func:`_start_blmpop` sent is read
    and every message in it delivered; a BRPOP's reply is read as kombu would."""
    original_brpop_read = channel_cls._brpop_read

    def _brpop_read(self, **options):
        if not getattr(self, "_distscrape_many", False):
            return original_brpop_read(self, **options)
        self._distscrape_many = False
        try:
            try:
                # Read as BRPOP: the client's reply handling for it (a tuple, the global key
                # prefix taken off the key) fits BLMPOP's [key, [message, ...]] too.
                reply = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            except ResponseError as exc:
                # Refused (an ACL without BLMPOP, say): nothing was popped; BRPOP from now on.
                self._distscrape_blmpop = False
                log.warning("the broker refused BLMPOP (%s): fetching one message a round "
                            "trip", exc)
                raise Empty() from exc
            if not reply:
                raise Empty()
            key, items = reply
            _deliver_popped(self, key, items)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    channel_cls._brpop_read = _brpop_read


def _deliver_popped(channel, key, items) -> None:
    """Deliver the messages one BLMPOP popped from the list ``key``, in their order."""
    queue = bytes_to_str(key).rsplit(channel.sep, 1)[0]
    channel._queue_cycle.rotate(queue)
    for n, item in enumerate(items):
        try:
            channel.connection._deliver(loads(bytes_to_str(item)), queue)
        except BaseException:
            # The messages not yet delivered go back where they were popped from, in their
            # order (stock kombu loses the one message it was delivering).
            if items[n + 1:]:
                channel._create_client().rpush(key, *reversed(items[n + 1:]))
            raise
