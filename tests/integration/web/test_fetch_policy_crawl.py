"""A job's fetch policy in crawls by real worker processes: one cookie jar for all of them,
credentials, proxies and the CAs to trust read from each worker's own environment, and a worker
that lacks a credential (or trust in a site's certificate) failing the item, not itself."""

from __future__ import annotations

import threading
import time
from collections import Counter

from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher
from tests.support.crawl import check_all, crawl_settings
from tests.support.http import reply, serve
from tests.support.proxies import http_proxy
from tests.support.tls import TestCA, trusting

PAGES = 16


def html(handler, body: str, headers: dict | None = None) -> None:
    reply(handler, 200, body.encode(), {"Content-Type": "text/html", **(headers or {})})


def crawl(settings, workers, names, job: str, spec: dict, timeout: float = 120):
    procs = [workers(settings, name, concurrency=1) for name in names]
    tracker = RedisTracker.from_url(settings.redis_url)
    wait_for_workers(tracker, len(procs), procs=procs)
    configure_app(settings)
    manager = CrawlManager(tracker, publisher.scrape)
    manager.seed(job, build_spec(spec))
    manager.wait(job, timeout=timeout, check=check_all(procs))
    return tracker, procs


def test_two_workers_share_the_jobs_cookie_jar(redis_url, workers, tmp_path):
    """The start page sets a session cookie; every other page answers 403 without it. With two
    workers taking the pages, each sends the cookie the other's response set."""
    issued, lock = Counter(), threading.Lock()
    links = "".join(f'<a href="/p/{n}">{n}</a>' for n in range(PAGES))

    def start(handler):
        with lock:
            issued["sid"] += 1
        html(handler, links, {"Set-Cookie": "sid=S1; Path=/; HttpOnly"})

    def page(handler):
        if "sid=S1" not in (handler.headers.get("Cookie") or ""):
            reply(handler, 403, b"no session")
            return
        time.sleep(0.1)  # both workers get pages to take
        html(handler, "ok")

    routes = {"/": start, **{f"/p/{n}": page for n in range(PAGES)}}
    settings = crawl_settings(redis_url, lease_seconds=10)
    with serve(routes) as (base, _, log):
        tracker, _ = crawl(settings, workers, ["jar-0", "jar-1"], "jar", {
            "seeds": [base + "/"], "fetch": {"cookies": True},
            "saver": {"output": str(tmp_path / "out")}})
    assert tracker.dead_items("jar") == {}
    assert tracker.stats("jar").done == PAGES + 1
    assert issued["sid"] == 1
    pages = [entry for entry in log if entry["path"].startswith("/p/")]
    assert len(pages) == PAGES
    # Pages came over more than one connection: from both workers (a worker of concurrency 1
    # keeps one connection to the site alive).
    assert len({entry["port"] for entry in pages}) >= 2
    client = tracker.client
    assert client.hkeys("ds:{jar}:cookies") == ["127.0.0.1"]  # the host-only cookie's domain
    tracker.delete_job("jar")  # the jar goes with the job
    assert client.keys("ds:{jar}:*") == []


def test_a_crawl_through_a_proxy_with_a_credential_of_the_workers(redis_url, workers, tmp_path):
    links = "".join(f'<a href="/p/{n}">{n}</a>' for n in range(4))
    routes = {"/": lambda h: html(h, links), **{f"/p/{n}": lambda h: html(h, "ok")
                                                 for n in range(4)}}
    with http_proxy(credentials="px:pw") as proxy, serve(routes) as (base, _, log):
        settings = crawl_settings(
            redis_url, lease_seconds=10, proxies={"office": proxy.url("http", "px:pw")},
            credentials={"SHOP_TOKEN": "tok-worker"})
        tracker, _ = crawl(settings, workers, ["px-0", "px-1"], "proxied", {
            "seeds": [base + "/"], "saver": {"output": str(tmp_path / "out")},
            "fetch": {"proxies": ["office"],
                      "auth": {"scheme": "bearer", "credential": "SHOP_TOKEN"}}})
        stored_spec = tracker.load_spec("proxied")
    assert tracker.dead_items("proxied") == {}
    served = {entry["path"] for entry in log}
    assert {"/", *(f"/p/{n}" for n in range(4))} <= served
    # Everything went through the proxy, robots.txt too; the credential reached the site only.
    assert {entry["target"].split(base, 1)[1] for entry in proxy.log.entries} == served
    assert all(entry["headers"]["Authorization"] == "Bearer tok-worker" for entry in log)
    assert "tok-worker" not in stored_spec and "px:pw" not in stored_spec


def test_a_crawl_of_an_https_site_through_an_https_proxy(redis_url, workers, tmp_path):
    """TLS to the proxy and, inside its tunnel, to the site: both certificates signed by a CA
    that only the workers' ca_bundle setting makes trusted."""
    ca = TestCA.create(tmp_path)
    links = "".join(f'<a href="/p/{n}">{n}</a>' for n in range(4))
    routes = {"/": lambda h: html(h, links), **{f"/p/{n}": lambda h: html(h, "ok")
                                                 for n in range(4)}}
    with trusting(ca.bundle), http_proxy(credentials="px:pw", tls=ca.server_context()) as proxy, \
            serve(routes, tls=ca.server_context()) as (base, _, log):
        settings = crawl_settings(redis_url, lease_seconds=10, ca_bundle=ca.bundle,
                                  proxies={"tls": proxy.url("https", "px:pw")})
        tracker, _ = crawl(settings, workers, ["tls-0", "tls-1"], "tls", {
            "seeds": [base + "/"], "saver": {"output": str(tmp_path / "out")},
            "fetch": {"proxies": ["tls"]}})
    assert tracker.dead_items("tls") == {}
    assert tracker.stats("tls").done == 5
    assert {"/", *(f"/p/{n}" for n in range(4))} <= {entry["path"] for entry in log}
    # Nothing reached the site but through the proxy's tunnels.
    assert proxy.log.entries and all(
        (e.get("method"), e.get("target")) == ("CONNECT", base.split("://", 1)[1])
        for e in proxy.log.entries)
    saved = sorted(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert b"ok" in b"".join(saved)


def test_a_worker_that_does_not_trust_a_sites_certificate_fails_the_item_and_lives(
        redis_url, workers, tmp_path):
    ca = TestCA.create(tmp_path)
    settings = crawl_settings(redis_url, lease_seconds=10)
    with serve({"/": lambda h: html(h, "ok")}, tls=ca.server_context()) as (base, _, log):
        tracker, procs = crawl(settings, workers, ["notrust-0"], "notrust", {
            "seeds": [base + "/"], "saver": {"output": str(tmp_path / "out")}})
    [reason] = tracker.dead_items("notrust").values()
    assert "is not trusted: unable to get local issuer certificate" in reason
    assert "DISTSCRAPE_CA_BUNDLE" in reason
    check_all(procs)()  # the worker is alive
    assert log == []


def test_a_worker_without_the_credential_fails_the_item_and_lives(redis_url, workers, tmp_path):
    routes = {"/": lambda h: html(h, "ok")}
    settings = crawl_settings(redis_url, lease_seconds=10)
    with serve(routes) as (base, _, log):
        tracker, procs = crawl(settings, workers, ["nocred-0"], "nocred", {
            "seeds": [base + "/"], "saver": {"output": str(tmp_path / "out")},
            "fetch": {"auth": {"scheme": "bearer", "credential": "SHOP_TOKEN"}}})
    [reason] = tracker.dead_items("nocred").values()
    assert "credential SHOP_TOKEN" in reason and "DISTSCRAPE_CREDENTIAL_SHOP_TOKEN" in reason
    check_all(procs)()  # the worker is alive
    assert log == []  # not even robots.txt was asked without it


def test_the_in_memory_crawl_keeps_cookies_and_reads_credentials(tmp_path):
    """`distscrape crawl --in-memory`: the jar lives in its in-process tracker, the credential
    comes from the command's environment."""
    from tests.support.cli import run

    links = "".join(f'<a href="/p/{n}">{n}</a>' for n in range(4))

    def start(handler):
        html(handler, links, {"Set-Cookie": "sid=S1; Path=/"})

    def page(handler):
        ok = "sid=S1" in (handler.headers.get("Cookie") or "")
        reply(handler, 200 if ok else 403, b"ok" if ok else b"no session",
              {"Content-Type": "text/html"})

    routes = {"/": start, **{f"/p/{n}": page for n in range(4)}}
    with serve(routes) as (base, _, log):
        job = tmp_path / "job.toml"
        job.write_text(f'seeds = ["{base}/"]\n[fetch]\ncookies = true\n'
                       'auth = { scheme = "bearer", credential = "SHOP_TOKEN" }\n')
        res = run("crawl", "--config", str(job), "--output", str(tmp_path / "out"),
                  "--in-memory", env={"DISTSCRAPE_CREDENTIAL_SHOP_TOKEN": "tok-cli"})
    assert res.returncode == 0, res.stderr
    assert "tok-cli" not in res.stdout + res.stderr
    pages = [entry for entry in log if entry["path"].startswith("/p/")]
    assert len(pages) == 4 and all("sid=S1" in e["headers"]["Cookie"] for e in pages)
    assert all(e["headers"]["Authorization"] == "Bearer tok-cli" for e in log)


def test_what_the_seeding_side_knows_is_missing_is_refused_before_anything_is_fetched(
        tmp_path, redis_url):
    from tests.support.cli import assert_one_line_error, run

    with serve({"/": lambda h: html(h, "ok")}) as (base, _, log):
        job = tmp_path / "job.toml"
        job.write_text(f'seeds = ["{base}/"]\n[fetch]\nproxies = ["eu"]\n'
                       '[fetch.domains."api.example.org"]\n'
                       'auth = { scheme = "basic", credential = "API" }\n')
        # The crawl's own workers have this environment: the proxy and the credential.
        res = run("crawl", "--config", str(job), "--output", str(tmp_path / "out"), "--in-memory",
                  env={"DISTSCRAPE_PROXIES": "us=http://u:hush@127.0.0.1:9"})
        assert_one_line_error(res, "fetch.proxies: 'eu' is not one of the workers' proxies (us")
        assert "hush" not in res.stderr
        res = run("crawl", "--config", str(job), "--output", str(tmp_path / "out"), "--in-memory",
                  env={"DISTSCRAPE_PROXIES": "eu=http://127.0.0.1:9"})
        assert_one_line_error(
            res, 'fetch.domains."api.example.org".auth: credential API is not set: set '
            "DISTSCRAPE_CREDENTIAL_API")
        # A seeder knows the workers' proxies only if it has the setting; never their credentials.
        res = run("seed", "j", "--config", str(job), "--redis-url", redis_url,
                  env={"DISTSCRAPE_PROXIES": "us=http://127.0.0.1:9"})
        assert_one_line_error(res, "fetch.proxies: 'eu' is not one of the workers' proxies")
        assert RedisTracker.from_url(redis_url).jobs() == []
        res = run("seed", "j", "--config", str(job), "--redis-url", redis_url)
        assert res.returncode == 0, res.stderr
    assert log == []
