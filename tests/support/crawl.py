"""Crawls with real worker processes: settings, the workers' PYTHONPATH, seeding a generated
site and waiting for it, stopping workers, and comparing what was saved with the site."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from distscrape_celery.local.processes import WorkerProcess
from distscrape_celery.settings import Settings
from distscrape_celery.tracker import RedisTracker
from tests.support import REPO_ROOT
from tests.support.tracker_state import lease_holders


def plugins_path(*first: str) -> str:
    """PYTHONPATH for a worker that imports the tests' plug-ins (``tests.plugins.*``): ``first``,
    the repository root, then the caller's own PYTHONPATH, so that it works from any cwd."""
    return os.pathsep.join(filter(None, [*first, str(REPO_ROOT), os.environ.get("PYTHONPATH")]))


# Where the tests write their outputs (pytest's tmp_path, mkdtemp): the output root of the
# workers and runtimes that crawl_settings configures, as an operator's DISTSCRAPE_OUTPUT_ROOTS
# would be. Tests of the roots themselves give their own.
TEST_OUTPUT_ROOT = os.path.realpath(tempfile.gettempdir())


def crawl_settings(redis_url: str, **overrides) -> Settings:
    # An empty environ: tests must not depend on the shell's DISTSCRAPE_* variables.
    overrides.setdefault("output_roots", TEST_OUTPUT_ROOT)
    return Settings.from_env({}, redis_url=redis_url, **overrides)


def crawl_site_with_workers(settings: Settings, workers, site_server, out, job: str,
                            n_workers: int = 2, timeout: float = 120):
    """Start ``n_workers`` real workers, seed ``job`` with the site's root (the files saver into
    ``out``) and wait until it finishes, failing at once if a worker dies. Returns its stats."""
    from distscrape_celery.worker.app import configure_app
    from distscrape_celery.job.spec import build_spec
    from distscrape_celery.local.processes import wait_for_workers
    from distscrape_celery.core.manager import CrawlManager
    from distscrape_celery.worker.publish import publisher

    procs = [workers(settings, f"{job}-{i}") for i in range(n_workers)]
    tracker = RedisTracker.from_url(settings.redis_url)
    wait_for_workers(tracker, n_workers, procs=procs)
    configure_app(settings)
    manager = CrawlManager(tracker, publisher.scrape)
    manager.seed(job, build_spec({"seeds": [site_server.url("/")], "saver": {"output": str(out)}}))
    return manager.wait(job, timeout=timeout, check=check_all(procs))


class PluginWorker(WorkerProcess):
    """A worker process that may consume only some of the queues (``queues``: their names;
    None, both the scrape and the save queue)."""

    def __init__(self, *args, queues=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.queues = queues

    def command(self) -> list[str]:
        cmd = super().command()
        if self.queues:
            cmd[cmd.index("-Q") + 1] = ",".join(self.queues)
        return cmd


def check_all(procs):
    """A ``check`` for :meth:`CrawlManager.wait`: raises as soon as a worker of ``procs`` has
    died."""
    def check():
        for proc in procs:
            proc.check()
    return check


def registered_id(tracker, proc, timeout: float = 30) -> str:
    """The worker id under which ``proc`` (a started worker process) registered with
    ``tracker``; fails if it has not registered within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker in tracker.workers():
            if worker.pid == proc.proc.pid and worker.alive:
                return worker.id
        time.sleep(0.05)
    raise AssertionError(f"worker {proc.name} never registered")


def stop_all(procs, timeout: float) -> None:
    """Stop every worker of ``procs`` at once: each warm shutdown spends ~1.5 s closing its
    prefork pool, which would add up, worker after worker, at the end of every crawl test."""
    threads = [threading.Thread(target=w.stop, kwargs={"timeout": timeout}) for w in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def kill_all(procs) -> None:
    """End every worker of ``procs`` now (SIGKILL to each whole group): a test's clean-up, once
    its assertions are done, has nothing to gain from a warm shutdown but its seconds."""
    for w in procs:
        w.stop(timeout=0)


def saved_files(output) -> dict[str, bytes]:
    """Every file under ``output`` (relative path -> content), temp files of the saver excluded."""
    out = {}
    for path in Path(output).rglob("*"):
        if path.is_file() and not path.name.startswith(".~tmp-"):
            out[str(path.relative_to(output))] = path.read_bytes()
    return out


def expected_files(server, site, output) -> dict[str, bytes]:
    from distscrape_celery.savers import FileItemSaver

    saver = FileItemSaver(output)
    return {str(saver.name_for(server.url(p))): site.pages[p] for p in site.reachable}


def wait_until(what: str, cond, timeout: float = 90.0, procs=()):
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            p.check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def sigkill_mid_crawl(tracker, redis_client, job: str, victim, survivor, *, done: int,
                      also=lambda: True) -> int:
    """SIGKILL ``victim`` (a worker) once ``job`` has ``done`` items done, the victim holds a
    lease in it and ``also()`` holds; wait for it to end and return the job's done count then.
    Fails if the crawl finishes first or ``survivor`` dies meanwhile."""
    victim_id = registered_id(tracker, victim)
    while (tracker.stats(job).done < done
           or victim_id not in lease_holders(redis_client, job).values()
           or not also()):
        assert not tracker.stats(job).finished, "crawl finished before the kill"
        survivor.check()
        time.sleep(0.01)
    victim.kill(signal.SIGKILL)
    victim.proc.wait(10)
    return tracker.stats(job).done
