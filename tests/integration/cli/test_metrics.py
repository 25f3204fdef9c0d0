"""`distscrape metrics`: crawl figures for Prometheus, scraped over loopback HTTP during a real
crawl (real Redis, real workers) and checked against the tracker."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import redis
from tests.support.crawl import crawl_settings
from tests.support.ops import cli_env, free_port, http_get, metrics_once
from prometheus_client.parser import text_string_to_metric_families
from distscrape_celery.testing.sitegen import SiteServer, generate_site

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.cli.exporter import _DoneRate, crawl_registry, render
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import RedisTracker

AUTH = "prom:s3cret-pw"


def test_leased_by_worker_counts_what_each_worker_holds(tracker_factory):
    tracker = tracker_factory(lease_seconds=30)
    tracker.create_job("j", "{}")
    tracker.add("j", ["a", "b", "c"])
    w1 = tracker.register_worker("h1", 1, 2)
    w2 = tracker.register_worker("h2", 2, 2)
    assert tracker.leased_by_worker("j") == {}
    t_a = tracker.checkout("j", "a", w1, max_lost=10).token
    tracker.checkout("j", "b", w1, max_lost=10)
    tracker.checkout("j", "c", w2, max_lost=10)
    assert tracker.leased_by_worker("j") == {w1: 2, w2: 1}
    # Scraped: its save message waits in the broker, held by nobody until a worker begins it.
    tracker.scraped("j", "a", t_a)
    assert tracker.leased_by_worker("j") == {w1: 1, w2: 1}
    tracker.begin_save("j", "a", t_a, w2, max_lost=10)
    assert tracker.leased_by_worker("j") == {w1: 1, w2: 2}


def test_done_rate_spans_the_window():
    now = [0.0]
    rate = _DoneRate(window=10, clock=lambda: now[0])
    assert rate.update("j", 0) == 0.0
    for t, done in ((5, 50), (10, 100), (20, 300)):
        now[0] = t
        last = rate.update("j", done)
    assert last == pytest.approx((300 - 100) / 10)


def _get(url: str, auth: str | None = None) -> tuple[int, str]:
    status, body = http_get(url, auth)
    return status, body.decode()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _start_exporter(redis_url: str, env_auth: str) -> tuple[subprocess.Popen, str]:
    env = cli_env(redis_url, DISTSCRAPE_METRICS_AUTH=env_auth)
    proc = subprocess.Popen(
        [sys.executable, "-m", "distscrape_celery.cli", "metrics", "--port", "0"],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )
    line = proc.stderr.readline()  # the exporter says where it listens once it does
    match = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line)
    assert match, line + proc.stderr.read()
    return proc, match.group(1)


def test_exporter_figures_match_the_tracker_during_a_real_crawl(redis_url, workers, tmp_path):
    site = generate_site(n_pages=40, seed=3)
    settings = crawl_settings(redis_url, lease_seconds=10)
    procs = [workers(settings, f"metrics-{i}", concurrency=2) for i in range(2)]
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 2, procs=procs)
    configure_app(settings)
    exporter, url = _start_exporter(redis_url, AUTH)
    try:
        assert _get(url)[0] == 401
        assert _get(url, "prom:wrong")[0] == 401
        with SiteServer(site, delay=0.1) as server:
            spec = build_spec({"seeds": [server.url("/")], "saver": {"output": str(tmp_path / "o")}})
            CrawlManager(tracker, publisher.scrape).seed("mj", spec)
            ids = {w.id: w.host for w in tracker.workers()}
            saw_held, saw_rate = set(), 0.0
            deadline = time.monotonic() + 120
            while True:
                status, text = _get(url, AUTH)
                assert status == 200
                m = _samples(text)
                assert m[("distscrape_up", ())] == 1
                job = (("job", "mj"),)
                seen, done = m[("distscrape_job_seen_items_total", job)], m[("distscrape_job_done_items_total", job)]
                assert seen >= done + m[("distscrape_job_dead_items", job)]
                for (name, labels), value in m.items():
                    if name == "distscrape_worker_leased_items" and value > 0:
                        labels = dict(labels)
                        assert labels["job"] == "mj" and ids[labels["worker"]] == labels["host"]
                        saw_held.add(labels["worker"])
                saw_rate = max(saw_rate, m[("distscrape_job_pages_per_second", job)])
                for p in procs:
                    p.check()
                if m[("distscrape_job_finished", job)] == 1:
                    break
                assert time.monotonic() < deadline, text
                time.sleep(0.2)
        stats = tracker.stats("mj")
        status, text = _get(url, AUTH)
        m = _samples(text)
        expected = {
            "seen_items_total": stats.seen, "done_items_total": stats.done,
            "dead_items": stats.dead, "queued_items": stats.queued,
            "frontier_items": stats.frontier, "dispatched_items": stats.dispatched,
            "leased_items": stats.leased, "saving_items": stats.save_pending, "finished": 1,
        }
        got = {k: m[(f"distscrape_job_{k}", (("job", "mj"),))] for k in expected}
        assert got == expected
        # retry-dead lowers the dead count, so it is a gauge: a falling counter reads as a reset.
        assert "# TYPE distscrape_job_dead_items gauge" in text
        assert stats.done == len(site.reachable) and stats.dead == 0
        assert saw_held and saw_held <= set(ids)  # per-worker holdings were seen mid-crawl
        assert saw_rate > 0
        for w in tracker.workers():
            labels = tuple(sorted({"worker": w.id, "host": w.host}.items()))
            assert m[("distscrape_worker_alive", labels)] == 1
            assert m[("distscrape_worker_concurrency", labels)] == 2
    finally:
        exporter.terminate()
        exporter.wait(10)


def test_metrics_once_without_auth_and_bad_credentials_setting(redis_url):
    res = metrics_once(redis_url)
    assert res.returncode == 0, res.stderr
    assert _samples(res.stdout)[("distscrape_up", ())] == 1
    res = metrics_once(redis_url, DISTSCRAPE_METRICS_AUTH="no-colon-secret")
    assert res.returncode == 2
    assert "DISTSCRAPE_METRICS_AUTH" in res.stderr and "no-colon-secret" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_unreachable_tracker_is_distscrape_up_zero():
    # A port nothing listens on: the exporter stays up and says the tracker is down.
    tracker = RedisTracker(redis.Redis(port=free_port(), decode_responses=True, socket_connect_timeout=2))
    m = _samples(render(crawl_registry(tracker)).decode())
    assert m == {("distscrape_up", ()): 0}


def test_metrics_without_auth_refuses_to_serve_beyond_this_host(redis_url):
    """Without DISTSCRAPE_METRICS_AUTH the exporter answers no one but this host: a bind beyond
    loopback is refused at once, naming the setting; loopback (the default) is served."""
    for bind in ("0.0.0.0", "::"):
        proc = subprocess.Popen(
            [sys.executable, "-m", "distscrape_celery.cli", "metrics", "--bind", bind, "--port",
             "0"], env=cli_env(redis_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"--bind {bind} without auth is served: {err}")
        assert proc.returncode == 2, err
        [line] = err.strip().splitlines()
        assert f"--bind {bind}: " in line and "DISTSCRAPE_METRICS_AUTH" in line, line
    from distscrape_celery.cli.exporter import MetricsServer
    from distscrape_celery.errors import ConfigError

    registry = crawl_registry(RedisTracker.from_url(redis_url))
    with pytest.raises(ConfigError):
        MetricsServer(registry, bind="0.0.0.0", port=0)
    for bind in ("127.0.0.1", "localhost", "127.8.9.10"):
        server = MetricsServer(registry, bind=bind, port=0)
        server._httpd.server_close()
    server = MetricsServer(registry, bind="0.0.0.0", port=0, auth=AUTH)  # with auth: anywhere
    server._httpd.server_close()


def test_idle_connections_cannot_hold_the_exporters_threads(redis_url):
    """Connections that send nothing are closed after the handler's timeout, and a normal
    scrape is answered meanwhile."""
    import socket
    import threading

    from distscrape_celery.cli.exporter import MetricsServer

    class QuickServer(MetricsServer):
        handler_timeout = 1.0

    server = QuickServer(crawl_registry(RedisTracker.from_url(redis_url)), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    idle = [socket.create_connection(server.address, timeout=10) for _ in range(50)]
    try:
        status, body = http_get(server.url, timeout=10)
        assert status == 200 and b"distscrape_up 1.0" in body
        started = time.monotonic()
        for conn in idle:
            assert conn.recv(1) == b""  # closed by the server, not by our 10 s timeout
        assert time.monotonic() - started < 8
    finally:
        for conn in idle:
            conn.close()
        server._httpd.shutdown()
