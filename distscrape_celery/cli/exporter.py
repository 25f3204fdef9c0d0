"""Crawl figures for Prometheus: per job and per worker, read from the tracker at each scrape.

:class:`CrawlCollector` turns the tracker's counts into metric families; :class:`MetricsServer`
serves them over HTTP (``distscrape metrics``, in :mod:`.metrics`), behind basic auth when
credentials are set, and only on a loopback address when they are not.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ..errors import ConfigError, DistscrapeError, JobNotFound
from ..settings import ENV_PREFIX
from ..tracker import JobState, Tracker

log = logging.getLogger(__name__)

# The window over which the exporter's own pages/s gauge is averaged.
RATE_WINDOW_SECONDS = 60.0


class _DoneRate:
    """Pages done per second over the last ``window`` seconds, from the done counts seen at
    each scrape (the first scrape of a job gives 0)."""

    def __init__(self, window: float = RATE_WINDOW_SECONDS, clock=time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self._samples: dict[str, deque[tuple[float, int]]] = {}

    def update(self, job: str, done: int) -> float:
        now = self.clock()
        samples = self._samples.setdefault(job, deque())
        samples.append((now, done))
        # Keep one sample older than the window, so the rate spans the whole window.
        while len(samples) > 2 and samples[1][0] <= now - self.window:
            samples.popleft()
        (t0, d0), (t1, d1) = samples[0], samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0


class CrawlCollector(Collector):
    """Reads every job's counts and every worker's holdings from ``tracker`` when scraped.

    Counters (``*_total``) only grow, so ``rate()`` applies to them; the gauges are the current
    state. ``distscrape_up`` is 0 while the tracker cannot be read, and then nothing else is given.
    """

    def __init__(self, tracker: Tracker, rate_window: float = RATE_WINDOW_SECONDS) -> None:
        self.tracker = tracker
        self._rate = _DoneRate(rate_window)
        self._lock = threading.Lock()  # the rate samples are shared by concurrent scrapes

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("distscrape_up", "1 if the tracker could be read, else 0")
        try:
            families = self._families()
        except DistscrapeError as exc:
            log.warning("cannot read the tracker: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self) -> list[Metric]:
        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"distscrape_job_{name}_items", doc, labels=["job"])

        def gauge(name: str, doc: str, labels=("job",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels))

        seen = counter("seen", "Items the job has seen (deduplicated)")
        done = counter("done", "Items saved")
        # A gauge, not a counter: `distscrape retry-dead` queues dead items again, so it can fall.
        dead = gauge("distscrape_job_dead_items", "Items given up on now (retry-dead lowers it)")
        state = {
            "queued": gauge("distscrape_job_queued_items", "Items waiting: frontier plus dispatched"),
            "frontier": gauge("distscrape_job_frontier_items", "Items in the tracker's frontier"),
            "dispatched": gauge("distscrape_job_dispatched_items", "Items whose scrape message waits in the broker"),
            "leased": gauge("distscrape_job_leased_items", "Items a worker is scraping or saving"),
            # The metric keeps the name it was published under.
            "save_pending": gauge("distscrape_job_saving_items",
                                  "Items whose save message waits in the broker"),
        }
        finished = gauge("distscrape_job_finished", "1 once the job started and nothing is left to do")
        job_state = gauge("distscrape_job_state", "1 for the job's state (running, paused, "
                          "cancelled, finished), 0 for the others", labels=("job", "state"))
        rate = gauge("distscrape_job_pages_per_second",
                     f"Items done per second over the exporter's last {RATE_WINDOW_SECONDS:.0f} s")
        held = gauge("distscrape_worker_leased_items", "Items of a job a worker holds now",
                     labels=("job", "worker", "host"))
        alive = gauge("distscrape_worker_alive", "1 if the worker heartbeats within a lease",
                      labels=("worker", "host"))
        concurrency = gauge("distscrape_worker_concurrency", "The worker's concurrency",
                            labels=("worker", "host"))

        workers = self.tracker.workers()
        hosts = {w.id: w.host for w in workers}
        for w in workers:
            alive.add_metric([w.id, w.host], 1 if w.alive else 0)
            concurrency.add_metric([w.id, w.host], w.concurrency)
        for job in self.tracker.jobs():
            try:
                stats, info = self.tracker.stats(job), self.tracker.job_info(job)
            except JobNotFound:  # being deleted: its name goes last
                continue
            for s in JobState:
                job_state.add_metric([job, s.value], 1 if info.state is s else 0)
            for family, value in ((seen, stats.seen), (done, stats.done), (dead, stats.dead)):
                family.add_metric([job], value)
            for name, family in state.items():
                family.add_metric([job], getattr(stats, name))
            finished.add_metric([job], 1 if stats.finished else 0)
            with self._lock:
                rate.add_metric([job], self._rate.update(job, stats.done))
            for worker, n in sorted(self.tracker.leased_by_worker(job).items()):
                held.add_metric([job, worker, hosts.get(worker, "")], n)
        return [seen, done, dead, *state.values(), finished, job_state, rate, held, alive,
                concurrency]


def render(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in Prometheus' text format."""
    return generate_latest(registry)


class MetricsServer:
    """Serves ``/metrics`` from ``registry`` on ``bind``:``port`` (bound at construction). With
    ``auth`` ("USER:PASSWORD"), every request must carry those basic-auth credentials; without,
    ``bind`` must be a loopback address (:class:`ConfigError` otherwise), so that the figures,
    job names and worker hosts are shown to no one else. A connection that sends nothing for
    ``handler_timeout`` seconds is closed, so idle connections cannot hold its threads."""

    # Long enough for a Prometheus scrape on a slow link, short enough that a few hundred idle
    # connections are gone before they count.
    handler_timeout: float = 10.0

    def __init__(
        self, registry: CollectorRegistry, *, bind: str = "127.0.0.1", port: int = 9808,
        auth: Optional[str] = None,
    ) -> None:
        expected = auth.encode() if auth else None
        if expected is None and not is_loopback(bind):
            raise ConfigError(
                f"--bind {bind}: serving the metrics beyond this host needs basic auth; set "
                f"{ENV_PREFIX}METRICS_AUTH=USER:PASSWORD, or bind a loopback address (127.0.0.1)"
            )
        idle_limit = self.handler_timeout

        class Handler(BaseHTTPRequestHandler):
            # Applied to the connection's socket before the request is read (StreamRequestHandler).
            timeout = idle_limit

            def do_GET(self) -> None:
                if expected is not None and not _authorized(self.headers.get("Authorization"), expected):
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="distscrape metrics"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = render(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("%s " + fmt, self.address_string(), *args)

        self._httpd = ThreadingHTTPServer((bind, port), Handler)
        self._httpd.daemon_threads = True
        self.address = self._httpd.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def serve_forever(self) -> None:
        """Answer requests until the process is stopped."""
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names (an IP literal, or a name as this host resolves it)
    is a loopback address; False for a name that does not resolve."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(
        ipaddress.ip_address(info[4][0].split("%", 1)[0]).is_loopback for info in infos
    )


def _authorized(header: Optional[str], expected: bytes) -> bool:
    scheme, _, value = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        given = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(given, expected)


def crawl_registry(tracker: Tracker) -> CollectorRegistry:
    """A registry holding only the crawl's figures (no process metrics of the exporter)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CrawlCollector(tracker))
    return registry
