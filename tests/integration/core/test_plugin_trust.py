"""A job spec in Redis names the classes workers load and where they write: workers load plug-ins
only from the modules their own settings allow (DISTSCRAPE_PLUGIN_MODULES), never importing any
other, and write file outputs only under their own DISTSCRAPE_OUTPUT_ROOTS. What they refuse ends
dead with the reason; the worker lives on."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from tests.support.crawl import crawl_settings, plugins_path, stop_all

from distscrape_celery.worker.app import configure_app
from distscrape_celery.core.components import (
    build_saver, build_scraper, check_components, module_allowed,
)
from distscrape_celery.errors import ConfigError, OutputNotAllowed, PluginNotAllowed
from distscrape_celery.job.spec import build_spec
from distscrape_celery.local.processes import WorkerProcess, wait_for_workers
from distscrape_celery.core.manager import CrawlManager
from distscrape_celery.savers import FileItemSaver, TarItemSaver
from distscrape_celery.settings import Settings
from distscrape_celery.worker.publish import publisher
from distscrape_celery.tracker import InMemoryTracker, RedisTracker

SEED = "http://127.0.0.1:9/"


def hostile_module(directory: Path, marker: Path) -> str:
    """Write a module whose import leaves ``marker`` behind (what an attacker's code would run
    at import) and that holds a valid scraper and saver; return its (unique) name."""
    name = f"hostile_{uuid.uuid4().hex[:12]}"
    (directory / f"{name}.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "from distscrape_celery.savers import FileItemSaver\n"
        "from distscrape_celery.scrapers import SimpleScraper\n"
        "class Evil(SimpleScraper):\n    pass\n"
        "class EvilSaver(FileItemSaver):\n    pass\n"
    )
    return name


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """(module name, marker path) of a hostile module importable in this process."""
    marker = tmp_path / "imported.marker"
    monkeypatch.syspath_prepend(str(tmp_path))
    name = hostile_module(tmp_path, marker)
    yield name, marker
    sys.modules.pop(name, None)


# -- the allow-list ------------------------------------------------------------------------------


@pytest.mark.parametrize("module, allowed, expected", [
    ("mypkg", ["mypkg"], True),
    ("mypkg.x", ["mypkg"], True),
    ("mypkg.scrapers.deep", ["mypkg.scrapers"], True),
    ("mypkgevil", ["mypkg"], False),
    ("mypkg_evil.x", ["mypkg"], False),
    ("mypkg.savers", ["mypkg.scrapers"], False),
    ("mypkg", ["mypkg.scrapers"], False),  # a parent of an allowed module is not allowed
    ("other", ["mypkg", "other"], True),
    ("mypkg", [], False),
    ("mypkg..x", ["mypkg"], False),  # not a dotted name at all
])
def test_allow_list_matches_whole_dotted_components(module, allowed, expected):
    assert module_allowed(module, allowed) is expected


def test_a_module_outside_the_allow_list_is_never_imported(hostile):
    name, marker = hostile
    spec = build_spec({"seeds": [SEED], "scraper": {"kind": f"{name}:Evil"}})
    for settings in (Settings(), Settings(plugin_modules=["mypkg", name + "x", "hostile"])):
        with pytest.raises(PluginNotAllowed) as exc:
            build_scraper(spec, settings)
        assert f"module {name!r}" in str(exc.value)
        assert "DISTSCRAPE_PLUGIN_MODULES" in str(exc.value)
        assert str(exc.value).startswith("scraper.kind: ")
        with pytest.raises(PluginNotAllowed):
            check_components(spec, settings)
        tracker = InMemoryTracker()
        with pytest.raises(PluginNotAllowed):
            CrawlManager(tracker, lambda job, items: None, settings=settings).seed("j", spec)
        assert tracker.jobs() == []
    saver_spec = build_spec({"seeds": [SEED], "saver": {"kind": f"{name}:EvilSaver"}})
    with pytest.raises(PluginNotAllowed, match="saver.kind: "):
        build_saver(saver_spec, "j", "w1", Settings())
    assert name not in sys.modules
    assert not marker.exists()
    # Allowed by this process's settings, it loads.
    allowed = Settings(plugin_modules=[name])
    assert type(build_scraper(spec, allowed)).__name__ == "Evil"
    assert marker.exists()


def test_the_built_in_kinds_need_no_allow_list():
    settings = Settings()
    assert settings.plugin_modules == ()
    spec = build_spec({"seeds": [SEED]})
    build_scraper(spec, settings)
    check_components(spec, settings)
    full = build_spec({"seeds": [SEED],
                       "scraper": {"kind": "distscrape_celery.scrapers:SimpleScraper"}})
    build_scraper(full, settings)  # the built-in class by its own path
    # Our own package is no blanket exception: only the built-in classes are.
    other = build_spec({"seeds": [SEED], "saver": {"kind": "distscrape_celery.web.fetch:Fetcher"}})
    with pytest.raises(PluginNotAllowed):
        check_components(other, settings)


def test_settings_read_both_lists_from_the_environment():
    s = Settings.from_env({"DISTSCRAPE_PLUGIN_MODULES": "mypkg.scrapers, mypkg.savers,",
                           "DISTSCRAPE_OUTPUT_ROOTS": "/data/crawls,/srv/out/"})
    assert s.plugin_modules == ("mypkg.scrapers", "mypkg.savers")
    assert s.output_roots == ("/data/crawls", "/srv/out")
    assert Settings.from_env(s.to_env()) == s  # a worker started with to_env() gets the same
    assert Settings.from_env({}).output_roots is None  # unset: a worker writes no path
    for env, fragment in [
        ({"DISTSCRAPE_PLUGIN_MODULES": "mypkg,my-pkg"}, "DISTSCRAPE_PLUGIN_MODULES: 'my-pkg'"),
        ({"DISTSCRAPE_PLUGIN_MODULES": "mypkg:Class"}, "DISTSCRAPE_PLUGIN_MODULES: 'mypkg:Class'"),
        ({"DISTSCRAPE_OUTPUT_ROOTS": "data/crawls"}, "DISTSCRAPE_OUTPUT_ROOTS: 'data/crawls'"),
        ({"DISTSCRAPE_OUTPUT_ROOTS": ""}, "DISTSCRAPE_OUTPUT_ROOTS: "),
    ]:
        with pytest.raises(ConfigError) as exc:
            Settings.from_env(env)
        assert fragment in str(exc.value)


# -- output roots --------------------------------------------------------------------------------


def test_outputs_are_confined_under_the_roots(tmp_path):
    root, outside = tmp_path / "allowed", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    settings = Settings(output_roots=[str(root)])

    def files(output: Path):
        return build_saver(build_spec({"seeds": [SEED], "saver": {"output": str(output)}}),
                           "j", "w1", settings)

    assert isinstance(files(root / "site"), FileItemSaver)
    assert isinstance(files(root), FileItemSaver)  # the root itself
    for bad in (outside / "site", root / ".." / "outside" / "site", root / "escape" / "site",
                Path(str(root) + "-evil")):
        with pytest.raises(OutputNotAllowed) as exc:
            files(bad)
        message = str(exc.value)
        assert message.startswith("saver.output: ") and "DISTSCRAPE_OUTPUT_ROOTS" in message
        assert str(bad) in message
    tar = build_spec({"seeds": [SEED], "saver": {"output": str(root / "escape" / "site.tar")}})
    with pytest.raises(OutputNotAllowed):
        build_saver(tar, "j", "w1", settings)
    with pytest.raises(OutputNotAllowed):
        check_components(tar, settings)
    with pytest.raises(OutputNotAllowed, match="DISTSCRAPE_OUTPUT_ROOTS is unset"):
        build_saver(tar, "j", "w1", Settings())  # unset: a worker writes no path
    check_components(tar, Settings())  # ... while a seeder without roots leaves it to the workers
    assert isinstance(build_saver(tar, "j", "w1", Settings(output_roots=[str(outside)])),
                      TarItemSaver)
    assert list(outside.iterdir()) == []  # nothing was created there
    # A root that is itself a symlink allows what lies under where it leads.
    link_root = tmp_path / "link-root"
    link_root.symlink_to(root)
    build_saver(build_spec({"seeds": [SEED], "saver": {"output": str(root / "a")}}), "j", "w1",
                Settings(output_roots=[str(link_root)]))


# -- the pipeline, without Celery -----------------------------------------------------------------


def test_refused_components_end_items_dead_at_once_in_the_pipeline(redis_url, tmp_path, hostile):
    """A refused scraper ends its item dead before anything is fetched; a refused output ends a
    whole save batch dead (the pipeline returns, it does not raise), with the reason, never
    retried, though the job allows retries."""
    from tests.support.http import RouteServer
    from tests.support.pipeline import Recorder

    from distscrape_celery.core.pipeline import ItemPipeline
    from distscrape_celery.core.runtime import Runtime

    name, marker = hostile
    outside = tmp_path / "outside"
    routes = {"/a": (200, b"a"), "/b": (200, b"b")}
    with RouteServer(routes) as server:
        rt = Runtime.for_redis(crawl_settings(
            redis_url, lease_seconds=30, save_batch_size=1, output_roots=str(tmp_path / "ok")))
        rt.tracker.register_worker("test", 1, 4)
        rec = Recorder()
        pipe = ItemPipeline(rt, rec)
        items = [server.base + "/a", server.base + "/b"]
        for job, spec in [
            ("scraper", {"scraper": {"kind": f"{name}:Evil"},
                         "saver": {"output": str(tmp_path / "ok")}}),
            ("output", {"saver": {"output": str(outside)}}),
        ]:
            built = build_spec({"seeds": items, "max_retries": 3, **spec})
            rt.tracker.create_job(job, built.to_json(), built.crawl_limits())
            rt.tracker.add(job, items)
        assert [pipe.scrape("scraper", item) for item in items] == ["dead", "dead"]
        assert server.hits == []
        assert [pipe.scrape("output", item) for item in items] == ["scraped", "scraped"]
        saves = [(item, token, meta) for _, item, token, meta in rec.saves]
        assert pipe.save_batch("output", saves) == ["dead", "dead"]
        for job, fragment in [("scraper", "DISTSCRAPE_PLUGIN_MODULES"),
                              ("output", "DISTSCRAPE_OUTPUT_ROOTS")]:
            assert rt.tracker.stats(job).dead == 2
            assert all(fragment in r for r in rt.tracker.dead_items(job).values())
    assert not marker.exists() and not outside.exists()


# -- the seeding CLI -----------------------------------------------------------------------------


def test_seed_cli_refuses_a_module_its_settings_do_not_allow(hostile, redis_url, capsys,
                                                            monkeypatch):
    import distscrape_celery.cli as cli

    name, marker = hostile
    monkeypatch.delenv("DISTSCRAPE_PLUGIN_MODULES", raising=False)
    try:
        cli.main(["seed", "j", SEED, "--scraper", f"{name}:Evil", "--redis-url", redis_url])
        status = 0
    except SystemExit as exc:
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert f"--scraper: '{name}:Evil': module {name!r} is not allowed" in err
    assert "DISTSCRAPE_PLUGIN_MODULES" in err and len(err.strip().splitlines()) == 1
    assert name not in sys.modules and not marker.exists()
    assert RedisTracker.from_url(redis_url).jobs() == []


def test_local_crawl_loads_the_modules_of_its_own_job_file(tmp_path):
    """`distscrape crawl` runs the user's own spec on workers of its own: what its job file names
    is allowed there, without DISTSCRAPE_PLUGIN_MODULES."""
    from distscrape_celery.testing.sitegen import SiteServer, generate_site

    marker = tmp_path / "imported.marker"
    plugin_dir = tmp_path / "mine"
    plugin_dir.mkdir()
    name = hostile_module(plugin_dir, marker)
    site = generate_site(n_pages=5, seed=3, unreachable=0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    env["PYTHONPATH"] = plugins_path(str(plugin_dir))
    with SiteServer(site) as server:
        res = subprocess.run(
            [sys.executable, "-m", "distscrape_celery.cli", "crawl", server.url("/"),
             "--scraper", f"{name}:Evil", "--output", str(tmp_path / "out"), "--concurrency", "2"],
            capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path,
        )
    assert res.returncode == 0, res.stderr
    assert f"{len(site.reachable)} saved, 0 dead" in res.stdout


# -- a real worker -------------------------------------------------------------------------------


def _seed_as_anyone(tracker, job: str, spec) -> None:
    """What anyone who can write to the tracker's Redis can do: store a spec and queue its seeds,
    checked by nothing of ours."""
    tracker.create_job(job, spec.to_json(), spec.crawl_limits())
    res = tracker.add(job, spec.seeds)
    publisher.scrape(job, res.dispatch)


def test_worker_ends_refused_items_dead_and_stays_alive(redis_url, tmp_path):
    from distscrape_celery.testing.sitegen import SiteServer, generate_site

    marker = tmp_path / "imported.marker"
    plugin_dir = tmp_path / "mod"
    plugin_dir.mkdir()
    name = hostile_module(plugin_dir, marker)
    root, outside = tmp_path / "allowed", tmp_path / "outside"
    root.mkdir()
    settings = crawl_settings(redis_url, lease_seconds=2, plugin_modules="tests.plugins",
                              output_roots=str(root))
    tracker = RedisTracker.from_url(redis_url)
    worker = WorkerProcess(settings, name="trust", concurrency=2, log_dir=str(tmp_path),
                           loglevel="INFO",
                           extra_env={"PYTHONPATH": plugins_path(str(plugin_dir))}).start()
    try:
        wait_for_workers(tracker, 1, procs=[worker])
        configure_app(settings)
        site = generate_site(n_pages=4, seed=11, unreachable=0)
        manager = CrawlManager(tracker, publisher.scrape)
        with SiteServer(site) as server:
            seeds = [server.url("/")]
            _seed_as_anyone(tracker, "evil-scraper", build_spec(
                {"seeds": seeds, "scraper": {"kind": f"{name}:Evil"},
                 "saver": {"output": str(root / "a")}}))
            _seed_as_anyone(tracker, "evil-output", build_spec(
                {"seeds": seeds, "scraper": {"max_depth": 0},
                 "saver": {"output": str(outside / "b")}}))
            for job, fragments in [
                ("evil-scraper", [f"module {name!r} is not allowed", "DISTSCRAPE_PLUGIN_MODULES"]),
                ("evil-output",
                 [f"saver.output: {str(outside / 'b')!r}", "DISTSCRAPE_OUTPUT_ROOTS"]),
            ]:
                stats = manager.wait(job, timeout=30, check=worker.check)
                assert (stats.done, stats.dead) == (0, 1), (job, stats)
                [reason] = tracker.dead_items(job).values()
                assert all(f in reason for f in fragments), reason
            # The worker is alive and still crawls what it allows.
            _seed_as_anyone(tracker, "fine", build_spec(
                {"seeds": seeds, "saver": {"output": str(root / "c")}}))
            stats = manager.wait("fine", timeout=30, check=worker.check)
            assert (stats.done, stats.dead) == (len(site.reachable), 0)
        assert worker.alive
        assert not marker.exists()  # the hostile module never ran
        assert not outside.exists()  # nothing was created outside the roots
    finally:
        stop_all([worker], timeout=10)
