"""The Celery app: ``celery -A distscrape_celery worker`` starts a worker with it.

Configuration comes from one :class:`~distscrape_celery.settings.Settings`, read from the
environment at import, or set by the CLI with :func:`configure_app` before anything connects.
"""

from __future__ import annotations

from typing import Any, Optional
from urllib.parse import parse_qsl, urlsplit

from celery import Celery
from kombu import Exchange, Queue

from ..redaction import escape_log_records
from ..settings import Settings
from ..web.trust import trust
from . import kombu_fixes
from .names import SAVE_BATCH_TASK, SAVE_TASK, SCRAPE_TASK

# The Redis transport's BRPOP timeout (see broker_transport_options).
BRPOP_SECONDS = 0.25
# The Redis transport's priority lists per queue (see broker_transport_options).
PRIORITY_STEPS = [0]


def kombu_broker(url: str) -> tuple[str, Optional[str]]:
    """The broker URL and virtual host to give kombu for our broker ``url``. kombu's Redis
    transport knows no unix:// (redis-py's form for a Unix socket): it takes
    redis+socket:///PATH, with the database as the virtual host."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "unix":
        return url, None
    db = dict(parse_qsl(parts.query)).get("db", "0")
    userinfo = parts.netloc  # "[user][:password]@" as written (percent-encoded), or ""
    return f"redis+socket://{userinfo}{parts.path}", db


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings derived from ours; the reasons are the crawl's guarantees."""
    broker_url, broker_vhost = kombu_broker(settings.effective_broker_url)
    return {
        "broker_url": broker_url,
        "broker_vhost": broker_vhost,
        **_serialization_and_results(),
        **_delivery(settings),
        "broker_transport_options": _broker_transport_options(settings),
        **_reconnection(),
        "worker_hijack_root_logger": False,
    }


def _serialization_and_results() -> dict[str, Any]:
    """What messages may carry, and what becomes of a task's result and events."""
    return {
        # JSON only: a pickle payload from the broker would run code in the worker.
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        # Results are never read; a result backend costs ~20% throughput.
        "result_backend": None,
        "task_ignore_result": True,
        # Task events (what Flower lists) cost about 10% of a worker's CPU, so they
        # are off unless asked for: the documented worker commands pass -E, and Flower turns them
        # on in every worker while it runs.
        "worker_send_task_events": False,
    }


def _delivery(settings: Settings) -> dict[str, Any]:
    """How tasks reach a worker, and how long they may run there."""
    return {
        # A task is acknowledged only after it ran, and re-delivered if its worker died, so the
        # broker backs up the tracker's own lease recovery.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Each queue gets its own exchange and routing key. Left to Celery's defaults, both would
        # be bound to the default queue's key, and every message would be delivered to both.
        "task_queues": [
            Queue(name, Exchange(name, type="direct"), routing_key=name)
            for name in (settings.scrape_queue, settings.save_queue)
        ],
        "task_default_queue": settings.scrape_queue,
        "task_routes": {SCRAPE_TASK: {"queue": settings.scrape_queue},
                        SAVE_TASK: {"queue": settings.save_queue},
                        SAVE_BATCH_TASK: {"queue": settings.save_queue}},
        "task_soft_time_limit": settings.task_soft_time_limit,
        "task_time_limit": settings.task_time_limit,
    }


def _broker_transport_options(settings: Settings) -> dict[str, Any]:
    """The Redis transport's options (other transports ignore them)."""
    return {
        # The Redis transport re-delivers an unacknowledged message after this; it must exceed
        # every task's time limit or a running task would be handed to a second worker.
        "visibility_timeout": settings.visibility_timeout,
        "ack_emulation": settings.broker_ack_emulation,
        # A Redis that hangs (partition, SIGSTOP) must not block a worker forever: reads time
        # out, dead peers are found by keepalive and health checks, and the consumer then
        # reconnects. Well above the BRPOP timeout (polling_interval, below).
        "socket_timeout": settings.redis_socket_timeout,
        "socket_connect_timeout": 10,
        "socket_keepalive": True,
        "health_check_interval": 25,
        # How long an idle consumer's BRPOP blocks (kombu's brpop_timeout, 1 s by default).
        # A worker stopping waits for the BRPOP in flight to answer, so this is how long a
        # warm shutdown of an idle worker takes at most; an idle worker polls 4 times a second.
        "polling_interval": BRPOP_SECONDS,
        # One list per queue: nothing here publishes with a priority. kombu's default keeps
        # four (priorities 0, 3, 6, 9), and every BRPOP then waits on 8 keys for our 2
        # queues (what one list saves is within noise: docs/performance.md). A message with
        # a priority still arrives (in the one list); one that another kombu left in a
        # priority list is not taken by these workers (lost_saves still reads those lists).
        "priority_steps": PRIORITY_STEPS,
    }


def _reconnection() -> dict[str, Any]:
    """What a worker does when it loses the broker."""
    return {
        # Ride out any Redis outage: reconnect forever (Celery's default gives up after 100
        # tries), at start-up too. Nothing is lost meanwhile: the tracker holds the crawl's state.
        "broker_connection_retry": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        # A task running when the broker connection drops finishes its work: its message is
        # redelivered after the reconnect and that duplicate does nothing (the tracker's fencing
        # tokens). Cancelling it, as Celery 6 will by default, would throw the download away.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
    }


# Celery imports the task modules and the worker's signal hooks when a worker starts, before
# its worker_init signal; a process that only publishes imports worker.publish itself.
app = Celery(
    "distscrape_celery",
    include=["distscrape_celery.worker.tasks", "distscrape_celery.worker.signals"],
)
_settings: Optional[Settings] = None


def configure_app(settings: Settings, *, in_memory: bool = False) -> Celery:
    """Apply ``settings`` to the app (before it first connects). ``in_memory`` uses Celery's
    in-process transport: no broker at all."""
    global _settings
    _settings = settings
    trust(settings.ca_bundle)
    _drop_connections()
    conf = celery_config(settings)
    if in_memory:
        conf["broker_url"] = "memory://localhost/"
        # The in-memory transport polls; its default 1 s poll would idle a worker between tasks.
        conf["broker_transport_options"] = {"polling_interval": 0.005}
    app.conf.update(conf)
    return app


def _drop_connections() -> None:
    """Forget connection and producer pools built for an earlier broker URL (tests and the
    in-memory crawl reconfigure the one app); Celery does the same after a fork."""
    # Not closed: kombu's global pool registry may hand the same pool out again for that URL.
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def current_settings() -> Settings:
    if _settings is None:
        configure_app(Settings.from_env())
    assert _settings is not None
    return _settings


current_settings()

# Before any channel exists: see kombu_fixes for the crash it prevents.
kombu_fixes.apply()
# Before the worker logs anything: log messages quote URLs and headers that sites sent.
escape_log_records()
