"""`distscrape crawl` as a process: signals stop everything it started, an interrupted crawl
resumes, and a bad --output is refused before anything is fetched.

The command runs as a real subprocess against a slow site on 127.0.0.1, with TMPDIR pointed at
the test's own directory so its temporary directories can be checked. What it started (the
embedded redis-server, the `celery worker` and its pool) is found through /proc.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import redis
from tests.support.crawl import crawl_settings, expected_files, saved_files
from tests.support.crawl_command import Crawl, as_from_a_terminal, wait_until
from tests.support.http import RouteServer
from distscrape_celery.testing.sitegen import SiteServer
from tests.support.sockets import listening

from distscrape_celery.worker.app import configure_app
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.embedded import EmbeddedRedis
from distscrape_celery.local.processes import WorkerProcess, can_fork_workers, wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.worker.publish import publisher
from distscrape_celery.local.shape import crawl_worker_processes
from distscrape_celery.tracker import RedisTracker

# Worker processes of `crawl --concurrency 2`: two per core, at most one per task.
CRAWL_WORKERS = len(crawl_worker_processes(2))


# -- processes, through /proc ------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, session, start time) of ``pid``, or None if it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[3]), int(fields[19])


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> dict[int, int]:
    """Every live process below ``root`` (pid -> start time, to tell a reused pid apart)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st and st[0] != "Z":
            children.setdefault(st[1], []).append(pid)
            starts[pid] = st[3]
    out, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out[child] = starts[child]
            todo.append(child)
    return out


def alive(procs: dict[int, int]) -> dict[int, str]:
    """Those of ``procs`` still running (not reaped and not a zombie), with their command lines."""
    out = {}
    for pid, start in procs.items():
        st = _stat(pid)
        if st and st[0] != "Z" and st[3] == start:
            out[pid] = _comm(pid)
    return out


def in_sessions(sessions: set[int]) -> dict[int, int]:
    """Live processes in any of ``sessions`` (the children run in sessions of their own, so a
    pool process forked after we looked is found too)."""
    out = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st and st[0] != "Z" and st[2] in sessions:
            out[pid] = st[3]
    return out


def kill_all(procs: dict[int, int]) -> None:
    for pid in alive(procs):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- the command -----------------------------------------------------------------------------


def _started_by_the_crawl(command: str) -> bool:
    """A redis-server or a worker process: not a short-lived helper one of them runs (a worker
    starting may run `uname -p` for its banner)."""
    return "redis-server" in command or ("celery" in command and "worker" in command)


def started_children(crawl: Crawl) -> dict[int, int]:
    """What the crawl started, once its redis-server and its workers are all up."""
    def ready() -> bool:
        found = descendants(crawl.proc.pid)
        cmds = [_comm(p) for p in found]
        # Forked workers have their supervisor beside them (worker.main --forks).
        return (any("redis-server" in c for c in cmds)
                and sum("celery" in c and "worker" in c for c in cmds)
                >= CRAWL_WORKERS + can_fork_workers())

    wait_until(ready, 60, "the redis-server and the workers", crawl)
    return {pid: start for pid, start in descendants(crawl.proc.pid).items()
            if _started_by_the_crawl(_comm(pid))}


EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_stops_everything_the_crawl_started(sig, small_site, tmp_path):
    with SiteServer(small_site, delay=0.2) as server:
        crawl = Crawl(tmp_path, server.url("/"), tmp_path / "out")
        children: dict[int, int] = {}
        try:
            children = started_children(crawl)
            wait_until(lambda: len(server.requests) >= 4, 60, "the crawl to fetch pages", crawl)
            sessions = {_stat(p)[2] for p in children if _stat(p)} - {os.getsid(0)}
            crawl.proc.send_signal(sig)
            signalled = time.monotonic()
            status = crawl.wait(30)
            stopped_in = time.monotonic() - signalled
            # Give orphans (if any) a moment: a child that outlived its parent by seconds is a leak.
            time.sleep(0.5)
            left = alive({**children, **in_sessions(sessions)})
            assert not left, f"still running after {sig.name} of the crawl: {left}"
            assert crawl.temp_dirs() == [], crawl.temp_dirs()
            assert status == EXIT_STATUS[sig], (status, crawl.stderr)
            assert "Traceback" not in crawl.stderr, crawl.stderr
            # The stop message names the signal that hurries it, not always Ctrl-C.
            again = "another Ctrl-C" if sig == signal.SIGINT else f"another {sig.name} (or Ctrl-C)"
            assert f"{again} stops it at once" in crawl.stderr, crawl.stderr
            assert stopped_in < 25, stopped_in
            print(f"\n{sig.name}: stopped in {stopped_in:.1f}s, "
                  f"{len(server.requests)} of {len(small_site.reachable)} pages fetched")
        finally:
            if crawl.proc.poll() is None:
                crawl.proc.kill()
            kill_all(children)


def test_one_signal_sent_twice_at_once_counts_once(small_site, tmp_path):
    """`timeout` sends SIGTERM to its command and then to its whole process group: that is one
    request to stop, and the worker still gets its warm shutdown."""
    with SiteServer(small_site, delay=3) as server:
        crawl = Crawl(tmp_path, server.url("/"), tmp_path / "out")
        children: dict[int, int] = {}
        try:
            children = started_children(crawl)
            wait_until(lambda: server.requests, 60, "the first download to start", crawl)
            # Back to back, as `timeout` sends them: a pause here, stretched by a loaded machine,
            # would make them two requests (lifecycle.ECHO_SECONDS).
            crawl.proc.send_signal(signal.SIGTERM)
            crawl.proc.send_signal(signal.SIGTERM)
            time.sleep(1)
            assert crawl.proc.poll() is None, "the worker was killed, not warm-stopped"
            assert crawl.wait(30) == 143, crawl.stderr
            assert not alive(children), alive(children)
        finally:
            if crawl.proc.poll() is None:
                crawl.proc.kill()
            kill_all(children)


def test_a_signal_ignored_at_start_stays_ignored(small_site, tmp_path):
    """`nohup distscrape crawl ...`: SIGHUP was ignored when the command started, so it is not
    a reason to stop."""
    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    with SiteServer(small_site, delay=0.2) as server:
        crawl = Crawl(tmp_path, server.url("/"), tmp_path / "out", preexec_fn=nohup)
        children: dict[int, int] = {}
        try:
            children = started_children(crawl)
            wait_until(lambda: len(server.requests) >= 2, 60, "the crawl to fetch pages", crawl)
            crawl.proc.send_signal(signal.SIGHUP)
            time.sleep(1.5)
            assert crawl.proc.poll() is None, crawl.stderr
            assert len(alive(children)) == len(children)
            crawl.proc.send_signal(signal.SIGTERM)
            assert crawl.wait(30) == 143, crawl.stderr
            assert not alive(children)
        finally:
            if crawl.proc.poll() is None:
                crawl.proc.kill()
            kill_all(children)


def test_a_second_signal_stops_the_worker_at_once(small_site, tmp_path):
    """The worker finishes its running downloads after the first signal; a download that takes
    long is cut short by a second signal (the exit status stays the first signal's)."""
    with SiteServer(small_site, delay=60) as server:
        crawl = Crawl(tmp_path, server.url("/"), tmp_path / "out")
        children: dict[int, int] = {}
        try:
            children = started_children(crawl)
            # The first download is robots.txt's (as slow as every page of this site).
            wait_until(lambda: server.requests or server.robots_requests, 60,
                       "the first download to start", crawl)
            crawl.proc.send_signal(signal.SIGTERM)
            time.sleep(2)
            assert crawl.proc.poll() is None, "the worker's running download was not waited for"
            crawl.proc.send_signal(signal.SIGINT)
            signalled = time.monotonic()
            assert crawl.wait(15) == 143, crawl.stderr
            assert time.monotonic() - signalled < 5
            assert not alive(children), alive(children)
            assert crawl.temp_dirs() == []
            assert "Traceback" not in crawl.stderr, crawl.stderr
        finally:
            if crawl.proc.poll() is None:
                crawl.proc.kill()
            kill_all(children)


def test_sigkill_of_the_crawl_takes_its_children_down(small_site, tmp_path):
    """Nothing can run in a SIGKILLed process; its children notice (PR_SET_PDEATHSIG) and stop.
    Its temporary directories stay behind: that is the documented limit."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    with SiteServer(small_site, delay=0.2) as server:
        crawl = Crawl(tmp_path, server.url("/"), tmp_path / "out")
        children: dict[int, int] = {}
        try:
            children = started_children(crawl)
            wait_until(lambda: len(server.requests) >= 4, 60, "the crawl to fetch pages", crawl)
            sessions = {_stat(p)[2] for p in children if _stat(p)} - {os.getsid(0)}
            crawl.proc.kill()
            crawl.proc.wait(10)
            killed = time.monotonic()
            deadline = killed + 30
            while alive({**children, **in_sessions(sessions)}) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = alive({**children, **in_sessions(sessions)})
            assert not left, f"still running 30s after SIGKILL of the crawl: {left}"
            print(f"\nSIGKILL: children gone {time.monotonic() - killed:.1f}s after the parent")
        finally:
            kill_all(children)


def test_worker_stop_lets_the_running_task_finish(redis_url, tmp_path):
    """WorkerProcess.stop is a warm shutdown: a download that is running when it is asked to stop
    completes (its item is scraped, not thrown away), so a new worker does not fetch it again."""
    settings = crawl_settings(redis_url, lease_seconds=5)
    tracker = RedisTracker.from_url(redis_url)
    configure_app(settings)
    with RouteServer({"/": (200, b"<html>slow page, no links</html>", 2.0)}) as site:
        first = WorkerProcess(settings, name="warm-1", concurrency=1, log_dir=str(tmp_path)).start()
        second = None
        try:
            wait_for_workers(tracker, 1, procs=[first])
            out = tmp_path / "out"
            manager = CrawlManager(tracker, publisher.scrape)
            manager.seed("warm", build_spec({"seeds": [site.base + "/"], "saver": {"output": str(out)}}))
            wait_until(lambda: site.page_hits, 30, "the download to start")
            first.stop(timeout=20)
            assert not first.alive
            second = WorkerProcess(settings, name="warm-2", concurrency=1, log_dir=str(tmp_path)).start()
            stats = manager.wait("warm", timeout=60, check=second.check)
        finally:
            first.stop(timeout=5)
            if second is not None:
                second.stop(timeout=5)
    assert (stats.done, stats.dead) == (1, 0)
    assert site.page_hits == ["/"], site.hits  # the first worker's download was not thrown away


def test_worker_stop_kills_a_worker_that_takes_too_long(redis_url, tmp_path):
    settings = crawl_settings(redis_url, lease_seconds=5)
    tracker = RedisTracker.from_url(redis_url)
    configure_app(settings)
    with RouteServer({"/": (200, b"<html>very slow</html>", 30.0)}) as site:
        worker = WorkerProcess(settings, name="slow", concurrency=1, log_dir=str(tmp_path)).start()
        try:
            wait_for_workers(tracker, 1, procs=[worker])
            group = {}
            CrawlManager(tracker, publisher.scrape).seed(
                "slow", build_spec({"seeds": [site.base + "/"], "saver": {"output": str(tmp_path / "o")}}))
            wait_until(lambda: site.page_hits, 30, "the download to start")
            group = in_sessions({worker.proc.pid})
            started = time.monotonic()
            worker.stop(timeout=2)
            took = time.monotonic() - started
        finally:
            worker.stop(timeout=1)
    assert took < 8, took
    assert len(group) >= 2 and not alive(group), alive(group)


# -- resume ----------------------------------------------------------------------------------


def test_an_interrupted_crawl_resumes_where_it_stopped(small_site, tmp_path):
    out = tmp_path / "out"
    n = len(small_site.reachable)
    with SiteServer(small_site, delay=0.1) as server:
        first = Crawl(tmp_path, server.url("/"), out, tag="first")
        try:
            wait_until(lambda: len(saved_files(out)) >= 15, 60, "15 pages saved", first)
            first.proc.send_signal(signal.SIGINT)
            assert first.wait(30) == 130, first.stderr
        finally:
            if first.proc.poll() is None:
                first.proc.kill()
        saved_before = set(saved_files(out))
        fetched_before = server.counts()
        assert 15 <= len(saved_before) < n, len(saved_before)
        assert (tmp_path / "out.distscrape-state").is_dir()
        assert "--state-dir" in first.stderr or "resume" in first.stderr, first.stderr

        server.delay = 0.02  # the rest may go fast
        second = Crawl(tmp_path, server.url("/"), out, tag="second")
        assert second.wait(120) == 0, second.stderr
        assert f"resuming job crawl-127.0.0.1_{server.port}: {len(saved_before)} done," in second.stderr, \
            second.stderr
        assert f"{n} saved, 0 dead" in second.stdout, second.stdout
        counts = server.counts()

        # Everything is saved, exactly the site.
        assert saved_files(out) == expected_files(server, small_site, out)
        assert set(counts) == small_site.reachable
        # Pages saved before the interruption were not downloaded again ...
        by_path = {_saved_name(server, out, path): path for path in small_site.reachable}
        refetched_saved = [by_path[name] for name in saved_before if counts[by_path[name]] > 1]
        assert refetched_saved == [], refetched_saved
        # ... and the work in flight at the interruption costs at most a few downloads.
        extra = sum(counts.values()) - n
        assert extra <= 6, (extra, {p: c for p, c in counts.items() if c > 1})

        # A finished job is not crawled again ...
        before = len(server.requests)
        third = Crawl(tmp_path, server.url("/"), out, tag="third")
        assert third.wait(60) == 0, third.stderr
        assert "already finished" in third.stderr + third.stdout, (third.stdout, third.stderr)
        assert len(server.requests) == before
        # ... unless asked to start over.
        fresh = Crawl(tmp_path, server.url("/"), out, "--fresh", tag="fresh")
        assert fresh.wait(120) == 0, fresh.stderr
        assert "resuming" not in fresh.stderr
        assert len(server.requests) == before + n
        assert fresh.temp_dirs() == []
    print(f"\nresume: {len(saved_before)} pages saved before SIGINT, "
          f"{sum(fetched_before.values())} fetched; {extra} extra download(s) in all")


def test_the_crawls_processes_reach_its_redis_on_a_unix_socket(small_site, tmp_path):
    """On one machine a Unix socket costs Redis less CPU a request than TCP on 127.0.0.1: the
    embedded Redis's clients, the workers' brokers included, come through its socket. (A short
    output path: a socket's path may not exceed about 100 bytes, and the state directory is
    beside the output.)"""
    short = Path(tempfile.mkdtemp(prefix="ds-sock-", dir="/tmp"))
    try:
        out, state = short / "out", short / "out.distscrape-state"
        with SiteServer(small_site, delay=0.05) as server:
            crawl = Crawl(tmp_path, server.url("/"), out)
            try:
                wait_until(lambda: len(saved_files(out)) >= 10 if out.exists() else False, 60,
                           "10 pages saved", crawl)
                client = redis.Redis(unix_socket_path=str(state / "redis.sock"),
                                     password=(state / "redis.password").read_text().strip())
                clients = [c for c in client.client_list() if c["id"] != client.client_id()]
                assert len(clients) >= CRAWL_WORKERS, clients
                assert [c["addr"] for c in clients if not c["addr"].startswith("/")] == []
                assert crawl.wait(120) == 0, crawl.stderr
            finally:
                if crawl.proc.poll() is None:
                    crawl.proc.kill()
        assert saved_files(out) == expected_files(server, small_site, out)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_a_crawl_on_a_redis_named_by_a_unix_url_runs(small_site, tmp_path):
    """A unix:// URL (redis-py's form) is one the settings take; Celery's Redis transport knows
    only redis+socket://, and the workers once died on it ('No such transport: unix')."""
    with EmbeddedRedis() as redis_server, SiteServer(small_site) as server:
        url = redis_server.socket_url.replace("db=0", "db=3")
        out = tmp_path / "out"
        crawl = Crawl(tmp_path, server.url("/"), out, "--redis-url", url)
        assert crawl.wait(120) == 0, crawl.stderr
        assert saved_files(out) == expected_files(server, small_site, out)
        # Tracker and broker both in database 3.
        assert redis.Redis.from_url(url.replace("db=3", "db=0")).dbsize() == 0
        assert redis.Redis.from_url(url).dbsize() > 0


@pytest.mark.parametrize("inline", [None, "false"], ids=["default", "save-tasks"])
def test_the_crawl_saves_pages_where_it_downloads_them(inline, small_site, tmp_path):
    """`distscrape crawl` saves each page in the worker process that downloaded it, with that
    process's save batch: no save message, no body staged in Redis. DISTSCRAPE_SAVE_INLINE=false
    brings the save tasks back."""
    with EmbeddedRedis() as redis_server, SiteServer(small_site) as server:
        seen: list[str] = []
        watching = threading.Event()

        def watch() -> None:
            with redis.Redis.from_url(redis_server.url).monitor() as monitor:
                watching.set()
                for event in monitor.listen():
                    seen.append(event["command"])

        threading.Thread(target=watch, daemon=True).start()
        assert watching.wait(10)
        out = tmp_path / "out"
        crawl = Crawl(tmp_path, server.url("/"), out, "--redis-url", redis_server.url,
                      env={"DISTSCRAPE_SAVE_INLINE": inline} if inline else None)
        assert crawl.wait(120) == 0, crawl.stderr
        assert saved_files(out) == expected_files(server, small_site, out)
    saves = [c for c in seen if "distscrape.save" in c and "LPUSH" in c.upper()]
    staged = [c for c in seen if c.upper().startswith("SET ") and ":body:" in c]
    if inline is None:
        assert (saves, staged) == ([], [])
    else:
        assert saves and staged


def test_resuming_drops_the_previous_runs_messages_and_puts_its_work_back(tmp_path):
    """What a resume does to a private Redis before its worker starts: the dead run's broker
    messages go, unacknowledged ones included (the Redis transport would restore those later),
    and its dispatched and leased items are back in the frontier, no attempt counted."""
    import redis

    from distscrape_celery.local.crawl import _forget_previous_run
    from distscrape_celery.local.embedded import EmbeddedRedis
    from distscrape_celery.tracker import LeaseStatus

    with EmbeddedRedis(state_dir=tmp_path / "state") as server:
        configure_app(crawl_settings(server.url))
        tracker = RedisTracker.from_url(server.url, bound_refresh_seconds=0, dispatch_factor=2)
        previous = tracker.register_worker("old-host", 1, 2)  # a worker of the stopped run
        seeds = [f"http://127.0.0.1:9/{n}" for n in "abc"]
        manager = CrawlManager(tracker, publisher.scrape)
        assert manager.seed("j", build_spec({"seeds": seeds, "saver": {"output": str(tmp_path)}})).dispatched == 3
        assert tracker.checkout("j", seeds[0], previous, max_lost=10).status is LeaseStatus.OK
        client = redis.Redis.from_url(server.url)
        assert client.llen("distscrape.scrape") == 3
        client.hset("unacked", "tag-1", "[]")  # a message the dead worker had reserved
        client.zadd("unacked_index", {"tag-1": 1.0})

        assert _forget_previous_run(tracker, "j") == 3
        assert client.llen("distscrape.scrape") == 0
        assert client.exists("unacked", "unacked_index") == 0
        assert [w.alive for w in tracker.workers()] == [False]
        stats = tracker.stats("j")
        assert (stats.frontier, stats.dispatched, stats.leased, stats.done) == (3, 0, 0, 0)
        assert client.hlen("ds:{j}:fails") == 0 and client.hlen("ds:{j}:lost") == 0


def _saved_name(server, out, path: str) -> str:
    from distscrape_celery.savers import FileItemSaver

    return str(FileItemSaver(out).name_for(server.url(path)))


# -- bad output ------------------------------------------------------------------------------


def _bad_outputs(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    return {"a file": a_file, "under a file": a_file / "sub"}


@pytest.mark.parametrize("where", ["a file", "under a file"])
@pytest.mark.parametrize("mode", ["embedded", "in-memory"])
def test_unwritable_output_is_refused_before_anything_is_fetched(where, mode, small_site, tmp_path):
    from tests.support.cli import assert_one_line_error

    output = _bad_outputs(tmp_path)[where]
    extra = ["--in-memory"] if mode == "in-memory" else []
    with SiteServer(small_site) as server:
        crawl = Crawl(tmp_path, server.url("/"), output, *extra)
        status = crawl.wait(120)
        res = subprocess.CompletedProcess(crawl.proc.args, status, crawl.stdout, crawl.stderr)
        assert_one_line_error(res, "output", str(output))
        assert server.requests == []
    assert crawl.temp_dirs() == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only directory anyway")
def test_read_only_output_is_refused(small_site, tmp_path):
    from tests.support.cli import assert_one_line_error

    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with SiteServer(small_site) as server:
        crawl = Crawl(tmp_path, server.url("/"), ro, "--in-memory")
        res = subprocess.CompletedProcess(crawl.proc.args, crawl.wait(60), crawl.stdout, crawl.stderr)
        assert_one_line_error(res, "output", str(ro))
        assert server.requests == []


def test_seed_checks_the_output_when_the_workers_are_on_this_host(redis_url, workers, tmp_path):
    from tests.support.cli import assert_one_line_error, run

    bad = _bad_outputs(tmp_path)["under a file"]
    # No worker alive: the output is on hosts we cannot see, so it is not checked here.
    res = run("seed", "elsewhere", "http://127.0.0.1:9/", "--output", str(bad), "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    # Every live worker runs on this host: the output is checked, and nothing is created.
    tracker = RedisTracker.from_url(redis_url)
    wait_for_workers(tracker, 1, procs=[workers(crawl_settings(redis_url), "local-0", concurrency=1)])
    res = run("seed", "here", "http://127.0.0.1:9/", "--output", str(bad), "--redis-url", redis_url)
    assert_one_line_error(res, "output", str(bad))
    assert "here" not in tracker.jobs()


def test_the_state_directory_is_guarded(tmp_path):
    from tests.support.cli import assert_one_line_error, run

    from distscrape_celery.local.embedded import EmbeddedRedis

    out = tmp_path / "o"
    # A directory holding other things is not taken for a state directory, nor emptied.
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "notes.txt").write_text("mine")
    res = run("crawl", "http://127.0.0.1:9/", "--output", str(out), "--state-dir", str(docs), "--fresh")
    assert_one_line_error(res, str(docs), "holds no crawl state")
    assert (docs / "notes.txt").read_text() == "mine"
    # The state holds this crawl's job under another spec: refused, with the way out.
    state = tmp_path / "o.distscrape-state"
    with EmbeddedRedis(state_dir=state) as server:
        tracker = RedisTracker.from_url(server.url)
        CrawlManager(tracker, lambda job, items: None).seed("crawl-127.0.0.1_9", build_spec({
            "seeds": ["http://127.0.0.1:9/"], "scraper": {"link_regex": "x"},
            "saver": {"output": str(out)},
        }))
    res = run("crawl", "http://127.0.0.1:9/", "--output", str(out))
    assert_one_line_error(res, "different spec", "--fresh")
    # Another crawl's unfinished job is in it: its workers would crawl that job too.
    res = run("crawl", "http://127.0.0.1:10/", "--output", str(out))
    assert_one_line_error(res, "'crawl-127.0.0.1_9'", "not finished", "--fresh")
    # --state-dir and --fresh belong to the embedded Redis.
    for extra in (["--in-memory", "--fresh"], ["--redis-url", "redis://127.0.0.1:9/0", "--state-dir", "x"]):
        res = run("crawl", "http://127.0.0.1:9/", *extra)
        assert res.returncode == 2 and "Error: --state-dir and --fresh are for the embedded Redis" in res.stderr


def _crawl_into(server, out: Path, *extra: str):
    from tests.support.cli import run

    return run("crawl", server.url("/"), "--output", str(out), "--quiet", "--concurrency", "2",
               *extra)


def _another_users_directory(tmp_path: Path) -> Path:
    """A directory of another user, mode 0700: as root, one made here and given to nobody
    (65534); as anyone else, /, which is root's."""
    if os.geteuid() != 0:
        return Path("/")
    theirs = tmp_path / "out.distscrape-state"
    theirs.mkdir(parents=True)
    os.chmod(theirs, 0o700)
    (theirs / "redis.password").write_text("attacker-password\n")
    os.chown(theirs / "redis.password", 65534, 65534)
    os.chown(theirs, 65534, 65534)
    return theirs


def test_a_state_directory_open_to_other_users_is_refused(small_site, tmp_path):
    """A state directory is found beside the output, often under /tmp: another user may have
    made it first, or it may be open to them, holding their redis.password. Were it used, the
    crawl's Redis would take their password, and they would log in to it. Refused, with the
    way out, before anything is written in it."""
    from tests.support.cli import assert_one_line_error

    out, state = tmp_path / "out", tmp_path / "out.distscrape-state"
    state.mkdir()
    os.chmod(state, 0o777)
    (state / "redis.password").write_text("attacker-password\n")
    with SiteServer(small_site) as server:
        res = _crawl_into(server, out)
        assert_one_line_error(res, str(state), "mode 0777", f"chmod 700 {state}", "--state-dir")
        assert sorted(os.listdir(state)) == ["redis.password"]

        theirs = _another_users_directory(tmp_path / "other")
        res = _crawl_into(server, out, "--state-dir", str(theirs))
        assert_one_line_error(res, str(theirs), "belongs to user 0" if str(theirs) == "/"
                              else "belongs to user 65534", "--state-dir")


def test_a_state_directory_that_is_a_symlink_is_refused(small_site, tmp_path):
    """A symlink in place of the state directory leads the crawl's Redis, its password and
    its data wherever whoever made it chose: refused, not followed."""
    from tests.support.cli import assert_one_line_error

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chmod(elsewhere, 0o700)
    (tmp_path / "out.distscrape-state").symlink_to(elsewhere)
    (tmp_path / "link").symlink_to(elsewhere)
    with SiteServer(small_site) as server:
        for given in ([], ["--state-dir", str(tmp_path / "link")]):
            res = _crawl_into(server, out, *given)
            assert_one_line_error(res, "symbolic link", "--state-dir")
    assert os.listdir(elsewhere) == []


@pytest.mark.parametrize("how", ["readable by others", "a symlink"])
def test_a_password_file_that_is_not_owner_only_is_refused(how, small_site, tmp_path):
    """redis.password is the one secret between the crawl and its Redis. One that others could
    read or write (or a symlink to one) is not used: the crawl stops with the way out, and
    --fresh starts over with a new password, written owner-only."""
    from tests.support.cli import assert_one_line_error

    out, state = tmp_path / "out", tmp_path / "out.distscrape-state"
    state.mkdir()
    os.chmod(state, 0o700)
    password = state / "redis.password"
    if how == "a symlink":
        (tmp_path / "theirs").write_text("attacker-password\n")
        os.chmod(tmp_path / "theirs", 0o600)
        password.symlink_to(tmp_path / "theirs")
    else:
        password.write_text("attacker-password\n")
        os.chmod(password, 0o644)
    with SiteServer(small_site) as server:
        res = _crawl_into(server, out)
        assert_one_line_error(res, str(password), "--fresh")
        res = _crawl_into(server, out, "--fresh")
        assert res.returncode == 0, res.stderr
    assert stat.S_ISREG(password.lstat().st_mode)
    assert stat.S_IMODE(password.lstat().st_mode) == 0o600
    assert "attacker-password" not in password.read_text()


def test_the_crawls_redis_listens_on_no_tcp_port(small_site, tmp_path):
    """The crawl's processes all reach its Redis on its Unix socket, so the server listens on
    nothing else: no TCP port for another user to try. The output here lies deep in the test's
    directory, too deep for a socket beside it, so the socket is in a private temporary
    directory (the crawl's TMPDIR is the test's own), and the crawl saves the whole site."""
    out = tmp_path / "out"
    with SiteServer(small_site, delay=0.05) as server:
        crawl = Crawl(tmp_path, server.url("/"), out)
        try:
            [pid] = [p for p in started_children(crawl) if "redis-server" in _comm(p)]
            listens = listening(pid)
            assert listens.tcp_ports == [], listens
            [path] = listens.unix_paths
            password = (tmp_path / "out.distscrape-state" / "redis.password").read_text().strip()
            client = redis.Redis(unix_socket_path=path, password=password)
            assert client.config_get("port") == {"port": "0"}
            assert crawl.wait(120) == 0, crawl.stderr
        finally:
            if crawl.proc.poll() is None:
                crawl.proc.kill()
    assert saved_files(out) == expected_files(server, small_site, out)
    assert crawl.temp_dirs() == [] and not os.path.exists(os.path.dirname(path))


def test_ctrl_c_on_the_readme_command_stops_the_crawl_cleanly_and_the_same_command_resumes(
        tmp_path):
    """The README's first command runs the crawl under distscrape_celery.testing.local_site. A
    Ctrl-C on the terminal goes to both; the wrapper must leave the crawl to stop what it started
    (killing it would leave its worker to the kernel and its temporary directories behind). The
    crawl says
    to run the same command again, and that command, serving the site on the same port, resumes
    the crawl and finishes it."""
    from tests.support.ops import free_port

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    env["TMPDIR"] = str(tmp)
    out = tmp_path / "crawl-output"
    # The README gives no --port (the script's fixed default); tests running at once each need
    # one of their own.
    command = [sys.executable, "-m", "distscrape_celery.testing.local_site", "--pages", "80",
               "--port", str(free_port()), "--delay", "0.2", "--", sys.executable, "-m",
               "distscrape_celery.cli", "crawl", "{url}", "--output", str(out), "--quiet",
               "--concurrency", "2"]
    with (tmp_path / "err").open("w") as err:
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=err, env=env,
            start_new_session=True,  # a "terminal"
            preexec_fn=as_from_a_terminal(),
        )
    children: dict[int, int] = {}
    try:
        def crawling() -> bool:
            nonlocal children
            children = descendants(proc.pid)
            cmds = [_comm(p) for p in children]
            return (any("redis-server" in c for c in cmds)
                    and sum("celery" in c and "worker" in c for c in cmds) >= CRAWL_WORKERS
                    and out.is_dir() and len(saved_files(out)) >= 3)

        wait_until(crawling, 60, "the crawl to save pages")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        assert proc.wait(30) == 130, (tmp_path / "err").read_text()
        time.sleep(0.5)
        assert not alive(children), alive(children)
        assert sorted(p.name for p in tmp.iterdir()) == []
        stderr = (tmp_path / "err").read_text()
        assert "run the same command again to resume" in stderr
        assert "another Ctrl-C stops it at once" in stderr, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_all(children)
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                           preexec_fn=as_from_a_terminal())
    assert again.returncode == 0, again.stderr
    assert "resuming job" in again.stderr and "80 saved" in again.stdout, again.stderr


def test_crawl_splits_its_concurrency_over_two_worker_processes_per_core():
    assert crawl_worker_processes(64, cpus=2) == [16, 16, 16, 16]
    assert crawl_worker_processes(5, cpus=2) == [2, 1, 1, 1]
    assert crawl_worker_processes(1, cpus=4) == [1]
    assert crawl_worker_processes(3, cpus=1) == [2, 1]


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "one-by-one"])
def test_the_crawl_forks_its_workers_where_it_can_and_starts_them_one_by_one_elsewhere(
        forked, small_site, tmp_path, monkeypatch):
    """Forked from one supervisor on Linux (worker.main --forks); one process each where that
    cannot be done. Either way every page is saved."""
    from distscrape_celery.local import crawl as crawl_module
    from distscrape_celery.local.crawl import run_local_crawl
    from distscrape_celery.settings import Settings

    if forked and not can_fork_workers():
        pytest.skip("forked workers are for Linux")
    monkeypatch.setattr(crawl_module, "can_fork_workers", lambda: forked)
    started: list = []
    real_start = WorkerProcess.start

    def recorded_start(self):
        started.append(self.forks)
        return real_start(self)

    monkeypatch.setattr(WorkerProcess, "start", recorded_start)
    out = tmp_path / "out"
    with SiteServer(small_site) as server:
        spec = build_spec({"seeds": [server.url("/")], "saver": {"kind": "files", "output": str(out)}})
        # No output roots: the crawl's own output is its workers' root.
        result = run_local_crawl("forks", spec, Settings(), embedded_redis=True, concurrency=2,
                                 timeout=120)
        assert saved_files(out) == expected_files(server, small_site, out)
    assert (result.stats.done, result.stats.dead) == (len(small_site.reachable), 0)
    assert started == ([crawl_worker_processes(2)] if forked else [None] * CRAWL_WORKERS)


def test_the_workers_run_the_package_the_crawl_runs(small_site, tmp_path):
    """The workers import the distscrape_celery the crawl command imported, not another copy in
    the directory it was started from (a source checkout of another version, say), which
    `python -m` would put first on their path: the two would disagree on the tracker's layout."""
    cwd = tmp_path / "elsewhere"
    (cwd / "distscrape_celery").mkdir(parents=True)
    (cwd / "distscrape_celery" / "__init__.py").write_text(
        'raise ImportError("a stray copy of distscrape_celery was imported")\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    env["TMPDIR"] = str(tmp_path)
    out = tmp_path / "out"
    with SiteServer(small_site) as server:
        # The installed command, whose own path starts at its bin directory, not at cwd.
        crawl = subprocess.run(
            [str(Path(sys.executable).parent / "distscrape"), "crawl", server.url("/"),
             "--output", str(out), "--quiet", "--concurrency", "2"],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert crawl.returncode == 0, crawl.stderr[-3000:]
    assert len(saved_files(out)) == len(small_site.reachable)


def test_in_memory_crawl_exits_right_after_its_last_page(small_site, tmp_path):
    """The in-process worker is stopped at once, not after its loop's next 2 s wait for a
    message, and the exit skips collecting it: the command ends within half a second of its
    summary, and soon after its last page (a save batch's wait and a status poll between)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    with SiteServer(small_site) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "distscrape_celery.cli", "crawl", server.url("/"), "--output",
             str(tmp_path / "out"), "--quiet", "--concurrency", "2", "--in-memory"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
            text=True)
        try:
            summary = proc.stdout.readline()
            summary_at = time.time()
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        exited = time.time()
        last_page = max(t for path in set(server.requests) for t in server.request_times(path))
    assert proc.returncode == 0 and "80 saved" in summary, (summary, out, err)
    assert exited - summary_at < 0.5, (exited - summary_at, err)
    assert exited - last_page < 1.5, (exited - last_page, err)
    assert "Got shutdown" not in err, err


def test_crawl_runs_on_its_own_redis_when_the_environment_names_one(small_site, tmp_path,
                                                                     redis_client):
    """A DISTSCRAPE_REDIS_URL exported for other commands does not pull a one-machine crawl
    (and the workers it starts) onto that Redis: it is named in a note, and left untouched."""
    url = redis_client.connection_pool.connection_kwargs
    env_url = f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}"
    with SiteServer(small_site) as server:
        crawl = Crawl(tmp_path, server.url("/"), tmp_path / "out",
                      env={"DISTSCRAPE_REDIS_URL": env_url})
        assert crawl.wait(120) == 0, crawl.stderr
    assert "80 saved" in crawl.stdout, crawl.stdout
    assert "does not use $DISTSCRAPE_REDIS_URL" in crawl.stderr, crawl.stderr
    assert redis_client.dbsize() == 0


@pytest.mark.parametrize("delay", [0.3, 0.6])
def test_ctrl_c_while_the_command_starts_is_one_line(delay, tmp_path):
    """Ctrl-C once Python runs the command but before it has imported what it runs (Python's
    own start-up, the first tens of milliseconds, is Python's): one line and status 130, no
    traceback."""
    crawl = Crawl(tmp_path, "http://127.0.0.1:9/", tmp_path / "out")
    time.sleep(delay)
    crawl.proc.send_signal(signal.SIGINT)
    status = crawl.wait(60)
    assert "Traceback" not in crawl.stderr, crawl.stderr
    if status == -signal.SIGINT:
        # On a loaded machine the signal can still come before the interpreter has installed
        # its handler: the default action ends it, silently (a shell shows 130 for that too);
        # on a loaded machine it was also seen to end that way after its one line.
        assert crawl.stderr in ("", "distscrape: interrupted\n"), crawl.stderr
        return
    assert status == 130, (status, crawl.stderr)
    assert crawl.stderr.strip().splitlines()[-1] == "distscrape: interrupted", crawl.stderr


def test_an_unreachable_redis_is_refused_before_the_output_is_made(tmp_path):
    from tests.support.cli import assert_one_line_error, run
    from tests.support.ops import closed_port

    out = tmp_path / "out"
    res = run("crawl", "http://127.0.0.1:9/", "--output", str(out), "--redis-url",
              f"redis://127.0.0.1:{closed_port()}/0")
    assert_one_line_error(res, "is unreachable")
    assert not out.exists()
