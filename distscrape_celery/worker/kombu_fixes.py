"""Two fixes to kombu's Redis transport: a worker rides out a Redis restart, and a publish does
not build a new Redis client.

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
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis

_MARK = "_distscrape_patched"


def apply() -> None:
    """Patch kombu's Redis ``Channel`` (idempotent)."""
    channel_cls = kombu_redis.Channel
    if getattr(channel_cls, _MARK, False):
        return
    original_init = channel_cls.__init__
    original_connparams = channel_cls._connparams
    original_create_client = channel_cls._create_client

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

    def _create_client(self, asynchronous=False):
        if asynchronous:
            return original_create_client(self, asynchronous)
        client = getattr(self, "_distscrape_client", None)
        if client is None or client.connection_pool is not self.pool:
            client = self._distscrape_client = original_create_client(self, asynchronous)
        return client

    channel_cls.__init__ = __init__
    channel_cls._connparams = _connparams
    channel_cls._create_client = _create_client
    setattr(channel_cls, _MARK, True)
