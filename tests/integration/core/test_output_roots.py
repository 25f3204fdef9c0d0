"""Where a worker writes is its operator's choice, not the job spec's: a spec comes from whoever
can write to the tracker's Redis. Without DISTSCRAPE_OUTPUT_ROOTS a worker writes no path at all;
under a root it still never writes where Python imports from or runs files; `distscrape crawl`
needs no setting (its own output is its workers' root), and `distscrape seed` without roots leaves
the check to the workers and says so."""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

import pytest
from tests.support.cli import assert_one_line_error, run
from tests.support.crawl import stop_all
from tests.support.http import RouteServer
from tests.support.ops import wait_for

from distscrape_celery.core.components import build_saver, check_components
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.errors import OutputNotAllowed
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import WorkerProcess, wait_for_workers
from distscrape_celery.savers import FileItemSaver
from distscrape_celery.settings import Settings
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.worker.app import configure_app
from distscrape_celery.worker.publish import publisher

SEED = "http://127.0.0.1:9/"
# What Python would run at the next start of the user whose user site receives it.
PTH_BODY = b"import pathlib; pathlib.Path('/tmp/distscrape-pth-ran').touch()\n"
USER_SITE_TAIL = (".local", "lib", f"python{sys.version_info.major}.{sys.version_info.minor}",
                  "site-packages")


def files_spec(output: str, name_scheme: str = "{host}/{path}", seeds=(SEED,)):
    return build_spec({"seeds": list(seeds),
                       "saver": {"kind": "files", "output": output, "name_scheme": name_scheme}})


def saver_for(output: str, settings: Settings):
    return build_saver(files_spec(output), "j", "w1", settings)


def test_a_worker_without_output_roots_refuses_every_path_output(tmp_path):
    for output in (str(tmp_path / "out"), str(tmp_path / "site.tar"), str(tmp_path / "a.warc.gz")):
        spec = build_spec({"seeds": [SEED], "saver": {"output": output}})
        with pytest.raises(OutputNotAllowed) as exc:
            build_saver(spec, "j", "w1", Settings())
        message = str(exc.value)
        assert message.startswith(f"saver.output: {output!r}: ")
        assert "DISTSCRAPE_OUTPUT_ROOTS is unset" in message
        # A seeding process without roots leaves the check to the workers, who write.
        check_components(spec, Settings())
    assert list(tmp_path.iterdir()) == []
    # The Redis saver writes no path: no root is needed for it.
    redis_spec = build_spec({"seeds": [SEED], "saver": {"output": "redis://127.0.0.1:9/0"}})
    build_saver(redis_spec, "j", "w1", Settings())


def test_a_worker_refuses_a_relative_or_tilde_output_even_under_a_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = Settings(output_roots=[str(tmp_path)])
    for output in ("out", "~/out", "./out"):
        with pytest.raises(OutputNotAllowed) as exc:
            saver_for(output, settings)
        assert f"{output!r} is not an absolute path" in str(exc.value)
        assert "DISTSCRAPE_OUTPUT_ROOTS" in str(exc.value)
    assert isinstance(saver_for(str(tmp_path / "out"), settings), FileItemSaver)


def test_outputs_where_python_imports_are_refused_under_any_root(tmp_path, monkeypatch):
    """A root of "/" allows every path but these: a site directory, a path under one or above
    one, an import directory or a path above it, and a package name in an import directory."""
    everything = Settings(output_roots=["/"])
    site_dir = site.getsitepackages()[0]
    user_site = site.getusersitepackages()
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.syspath_prepend(str(lib))
    refused = {
        site_dir: "is or contains the Python import directory",
        str(Path(site_dir) / "celery"): "lies under the Python site directory",
        str(Path(site_dir) / "not-a-name"): "lies under the Python site directory",
        str(Path(site_dir).parent): "is or contains the Python import directory",
        user_site: "is or contains the Python import directory",
        str(Path(user_site) / "x"): "lies under the Python site directory",
        str(Path(user_site).parents[2]): "is or contains the Python import directory",  # ~/.local
        str(lib): "is or contains the Python import directory",
        str(tmp_path): "is or contains the Python import directory",
        str(lib / "yaml"): "could be imported as the package 'yaml'",
        str(lib / "pkg" / "deeper"): "could be imported as the package 'pkg'",
    }
    for output, fragment in refused.items():
        with pytest.raises(OutputNotAllowed) as exc:
            saver_for(output, everything)
        assert fragment in str(exc.value), (output, str(exc.value))
        assert "DISTSCRAPE_OUTPUT_ROOTS" in str(exc.value)
    # Not a name Python imports: allowed under a plain import directory (never a site one).
    assert isinstance(saver_for(str(lib / "crawl-output"), everything), FileItemSaver)
    # A root of its own inside the import directory: its operator chose that name, not the spec.
    own = Settings(output_roots=[str(lib / "out")])
    assert isinstance(saver_for(str(lib / "out" / "blog"), own), FileItemSaver)
    assert not (lib / "yaml").exists() and not (lib / "pkg").exists()


def _run_refused_jobs(redis_url, home: Path, server, settings: Settings, tmp_path: Path,
                      tag: str) -> tuple[dict[str, str], Path]:
    """A real worker with HOME=``home`` and ``settings``; the spec of the hostile job stored in
    Redis as anyone who can write to it would, with the output given as ``~/...`` and as the
    worker's real user site. Returns each job's one dead reason, and the worker's log."""
    user_site = str(home.joinpath(*USER_SITE_TAIL))
    tracker = RedisTracker.from_url(redis_url)
    worker = WorkerProcess(settings, name=f"roots-{tag}", concurrency=2, pool="threads",
                           log_dir=str(tmp_path), loglevel="INFO",
                           extra_env={"HOME": str(home)}).start()
    reasons = {}
    try:
        wait_for_workers(tracker, 1, procs=[worker])
        configure_app(settings)
        manager = CrawlManager(tracker, publisher.scrape)
        for job, output in [(f"tilde-{tag}", "~/" + "/".join(USER_SITE_TAIL)),
                            (f"home-{tag}", user_site)]:
            spec = files_spec(output, "{path}", seeds=[server.base + "/x.pth"])
            tracker.create_job(job, spec.to_json(), spec.crawl_limits())
            publisher.scrape(job, tracker.add(job, spec.seeds).dispatch)
            stats = manager.wait(job, timeout=60, check=worker.check)
            assert (stats.done, stats.dead) == (0, 1), (job, stats)
            [reasons[job]] = tracker.dead_items(job).values()
        assert worker.alive
    finally:
        stop_all([worker], timeout=10)
    return reasons, worker.log_path


def test_a_redis_writer_cannot_drop_a_pth_file_into_the_workers_user_site(redis_url, tmp_path,
                                                                           monkeypatch):
    """The spec of the report: saver files, output the user site of the worker's user, name
    scheme {path}, a seed serving x.pth. No x.pth is written anywhere under HOME, with the roots
    unset and with the roots set to HOME itself; the items end dead naming the setting."""
    home = tmp_path / "home"
    home.mkdir()
    # The worker's own directory is HOME too: a "~" left unexpanded would land under it.
    monkeypatch.chdir(home)
    with RouteServer({"/x.pth": (200, PTH_BODY)}) as server:
        unset = Settings.from_env({}, redis_url=redis_url, lease_seconds=5)
        reasons, log = _run_refused_jobs(redis_url, home, server, unset, tmp_path, "unset")
        for job, reason in reasons.items():
            assert "DISTSCRAPE_OUTPUT_ROOTS is unset" in reason, (job, reason)
        assert ("DISTSCRAPE_OUTPUT_ROOTS is unset: this worker refuses every files, tar and "
                "warc output") in log.read_text()
        rooted = Settings.from_env({}, redis_url=redis_url, lease_seconds=5,
                                   output_roots=str(home))
        reasons, _ = _run_refused_jobs(redis_url, home, server, rooted, tmp_path, "home")
        assert "is not an absolute path" in reasons["tilde-home"]
        assert "is or contains the Python import directory" in reasons["home-home"]
        for reason in reasons.values():
            assert "DISTSCRAPE_OUTPUT_ROOTS" in reason
    assert not list(home.rglob("*.pth")), list(home.rglob("*"))
    assert list(home.iterdir()) == []  # nothing at all: no ~/.local, no "~" directory


def test_a_worker_logs_at_start_that_it_refuses_path_outputs_without_roots(redis_url, tmp_path):
    settings = Settings.from_env({}, redis_url=redis_url)
    worker = WorkerProcess(settings, name="no-roots", concurrency=1, pool="threads",
                           log_dir=str(tmp_path), loglevel="WARNING").start()
    warning = "DISTSCRAPE_OUTPUT_ROOTS is unset"
    try:
        wait_for_workers(RedisTracker.from_url(redis_url), 1, procs=[worker])
        # Logged once Celery's logging is set up, a moment after the worker registers.
        wait_for("the warning in the log", lambda: warning in worker.log_path.read_text())
    finally:
        stop_all([worker], timeout=10)
    log = worker.log_path.read_text()
    assert log.count("DISTSCRAPE_OUTPUT_ROOTS is unset: this worker refuses every files, tar "
                     "and warc output") == 1, log


# -- the commands ---------------------------------------------------------------------------------


def test_crawl_refuses_an_output_outside_the_environments_roots_before_starting(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    with RouteServer({"/": (200, b"hi")}) as server:
        for extra in ([], ["--in-memory"]):
            res = run("crawl", server.base + "/", "--output", str(outside), *extra,
                      env={"DISTSCRAPE_OUTPUT_ROOTS": str(root)})
            assert_one_line_error(res, "--output: ", "DISTSCRAPE_OUTPUT_ROOTS")
        assert server.hits == []
    assert not outside.exists() and list(root.iterdir()) == []


def test_crawl_needs_no_setting_and_confines_its_workers_to_its_output(tmp_path):
    """No DISTSCRAPE_OUTPUT_ROOTS: the crawl saves its pages, its workers' root being its own
    output; an output that is Python's user site is refused at once, before anything starts."""
    out = tmp_path / "out"
    with RouteServer({"/": (200, b"<a href='/b.html'>b</a>"), "/b.html": (200, b"b")}) as server:
        res = run("crawl", server.base + "/", "--output", str(out), "--concurrency", "2")
        assert res.returncode == 0, res.stderr
        assert "2 saved, 0 dead" in res.stdout
        home = tmp_path / "home"
        bad = home.joinpath(*USER_SITE_TAIL)
        res = run("crawl", server.base + "/", "--output", str(bad), "--in-memory",
                  env={"HOME": str(home), "PYTHONNOUSERSITE": "1"})
        assert_one_line_error(res, "--output: ", "is or contains the Python import directory")
    assert not bad.exists()


def test_seed_without_roots_notes_that_the_workers_decide(redis_url, tmp_path):
    res = run("seed", "j", SEED, "--output", str(tmp_path / "o"), "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    assert (f"distscrape: note: workers write {tmp_path / 'o'} only if their "
            "DISTSCRAPE_OUTPUT_ROOTS allows it") in res.stderr
    # With roots of its own the seeder checks, as a worker with them would, and says nothing.
    res = run("seed", "k", SEED, "--output", str(tmp_path / "o"), "--redis-url", redis_url,
              env={"DISTSCRAPE_OUTPUT_ROOTS": str(tmp_path)})
    assert res.returncode == 0 and "note:" not in res.stderr, res.stderr
    res = run("seed", "l", SEED, "--output", "/elsewhere/o", "--redis-url", redis_url,
              env={"DISTSCRAPE_OUTPUT_ROOTS": str(tmp_path)})
    assert_one_line_error(res, "--output: ", "DISTSCRAPE_OUTPUT_ROOTS")
    res = run("seed", "m", SEED, "--output", "redis://127.0.0.1:9/0", "--redis-url", redis_url)
    assert res.returncode == 0 and "note:" not in res.stderr, res.stderr
