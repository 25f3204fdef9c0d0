"""The Docker stack as a user runs it: a Docker engine of the test's own, the image built from
docker/Dockerfile on a base made from Debian's packages (Docker Hub is out of reach here), the
compose stack up, a generated site served by a container in the stack's network crawled whole,
Flower and the exporter answering only with their passwords, the job API only with its token (and
its dashboard served), and a worker container stopped mid-crawl losing nothing. It runs twice on
the one engine and image, one after the other: with ``docker compose`` (v2) and with
``docker-compose`` 1.29 (Debian 12's).

Needs root and Debian's docker.io, docker-compose and debootstrap, and the compose v2 plug-in
(.ci/run installs them all); skipped, with the reason, where no engine can be started, and failed
where one can but a compose tool is missing. The first run on a machine makes the base image (2
to 6 minutes) and the image's dependency layer (1.5 to 3 minutes), by the machine's load; both
stay in the engine's data root, so that later runs build nothing and each compose tool's run
takes about half a minute."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import redis

from distscrape_celery.savers import FileItemSaver
from distscrape_celery.testing.sitegen import generate_site
from distscrape_celery.tracker import RedisTracker
from distscrape_celery.tracker.keys import JobKeys
from tests.support import REPO_ROOT as ROOT
from tests.support.docker_engine import DockerEngine, EngineUnavailable, base_image
from tests.support.ops import free_port, http_get, wait_for

pytestmark = [pytest.mark.docker_engine, pytest.mark.timeout(1800)]

COMPOSE_TOOLS = ("v2", "v1.29")  # DockerEngine.compose_command's names
IMAGE = "distscrape-celery:latest"  # compose.yaml's image
PAGES, SITE_PORT, SITE_DELAY = 200, 8301, 0.3
REDIS_PASSWORD = "test-redis-7f3a9c"
FLOWER_AUTH = "admin:test-flower-51be"
METRICS_AUTH = "prometheus:test-metrics-c04d"
API_TOKEN = "test-api-token-9d2e6b41"
JOB = "site"


@pytest.fixture(scope="module")
def engine():
    try:
        with DockerEngine() as engine:
            yield engine
    except EngineUnavailable as exc:
        pytest.skip(f"no Docker engine can be started here: {exc}")


@pytest.fixture(scope="module")
def image(engine: DockerEngine) -> str:
    """``IMAGE`` built from docker/Dockerfile on the stand-in base, once for every compose tool;
    the base's name."""
    base, took = base_image(engine)
    t = time.monotonic()
    engine.docker("build", "--network", "host", "--build-arg", f"BASE_IMAGE={base}",
                  "-f", "docker/Dockerfile", "-t", IMAGE, ".", cwd=ROOT, timeout=1200)
    print(f"\nbase image {took:.1f} s (0: cached); image build {time.monotonic() - t:.1f} s")
    # The images of earlier builds, which this one replaced, would fill the data root run by run.
    engine.docker("image", "prune", "-f")
    return base


class Stack:
    """The compose project ``project`` of docker/compose.yaml plus the test's site service, run
    by the compose tool ``command``."""

    def __init__(self, engine: DockerEngine, tmp: Path, base: str, command: list[str], project: str) -> None:
        self.engine, self.project = engine, project
        self.flower_port, self.metrics_port, self.api_port = free_port(), free_port(), free_port()
        env_file = tmp / "stack.env"
        env_file.write_text("\n".join([
            f"COMPOSE_PROJECT_NAME={project}", f"REDIS_PASSWORD={REDIS_PASSWORD}",
            f"FLOWER_BASIC_AUTH={FLOWER_AUTH}", f"METRICS_AUTH={METRICS_AUTH}", f"API_TOKEN={API_TOKEN}",
            "WORKERS=2", "WORKER_CONCURRENCY=8", f"FLOWER_PORT={self.flower_port}",
            f"METRICS_PORT={self.metrics_port}", f"API_PORT={self.api_port}",
            f"BASE_IMAGE={base}", f"REDIS_IMAGE={base}", ""]))
        # The site: the crawler's own generated site, served by a container of the stack.
        site_file = tmp / "site.yaml"
        site_file.write_text(f"""\
services:
  site:
    image: {IMAGE}
    init: true
    command: ["python3", "-m", "distscrape_celery.testing.local_site", "--pages", "{PAGES}",
              "--delay", "{SITE_DELAY}", "--host", "0.0.0.0", "--port", "{SITE_PORT}"]
""")
        self.base = [*command, "--env-file", str(env_file),
                     "-f", str(ROOT / "docker" / "compose.yaml"), "-f", str(site_file)]

    def compose(self, *args: str, timeout: float = 600, check: bool = True):
        # No terminal on stdin: compose v2 would give `run` one.
        res = subprocess.run([*self.base, *args], env=self.engine.env, capture_output=True, text=True,
                             timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)
        if check and res.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} failed ({res.returncode}):\n"
                                 f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return res

    def containers(self, service: str) -> list[str]:
        return self.compose("ps", "-q", service).stdout.split()

    def ip(self, container: str) -> str:
        return self.engine.docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                                  container).stdout.strip()

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "40", check=False).stdout[-6000:]


def _saved(engine: DockerEngine, container: str, path: str) -> dict[str, bytes]:
    """Every file under ``path`` in ``container`` (relative path -> content)."""
    raw = subprocess.run([shutil.which("docker"), "cp", f"{container}:{path}", "-"], env=engine.env,
                         capture_output=True, timeout=300, check=True).stdout
    out = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for member in tar.getmembers():
            if member.isfile() and not Path(member.name).name.startswith(".~tmp-"):
                out[str(Path(*Path(member.name).parts[1:]))] = tar.extractfile(member).read()
    return out


@pytest.mark.parametrize("tool", COMPOSE_TOOLS)
def test_the_compose_stack_crawls_a_site_guards_its_uis_and_loses_nothing_when_a_worker_stops(
    engine, image, tool, tmp_path
):
    timings: dict[str, float] = {}
    started = time.monotonic()
    command = engine.compose_command(tool)
    # A project of each tool's own: nothing one run leaves can pass for the other's.
    stack = Stack(engine, tmp_path, image, command, project=f"dstest-{tool.replace('.', '')}")
    t = time.monotonic()
    stack.compose("up", "-d", "--no-build")
    try:
        timings["compose up"] = time.monotonic() - t
        redis_container = stack.containers("redis")[0]
        # The project's name from COMPOSE_PROJECT_NAME in the env file, as docs/deployment.md says.
        assert engine.docker("inspect", "-f", '{{index .Config.Labels "com.docker.compose.project"}}',
                             redis_container).stdout.strip() == stack.project
        redis_ip = stack.ip(redis_container)
        site_ip = stack.ip(stack.containers("site")[0])
        workers = stack.containers("worker")
        assert len(workers) == 2, stack.logs()
        tracker = RedisTracker.from_url(f"redis://:{REDIS_PASSWORD}@{redis_ip}:6379/0")
        wait_for("both worker containers registered",
                 lambda: sum(1 for w in tracker.workers() if w.alive) == 2, timeout=180)
        hosts = {w.host: w.id for w in tracker.workers() if w.alive}
        ids = {cid: hosts[cid[:12]] for cid in workers}  # a worker's host is its container's
        wait_for("the site answering", lambda: http_get(f"http://{site_ip}:{SITE_PORT}/")[0] == 200, timeout=120)

        # Flower and the exporter, published on the host's loopback, answer only with auth.
        flower = f"http://127.0.0.1:{stack.flower_port}"
        metrics = f"http://127.0.0.1:{stack.metrics_port}/metrics"
        wait_for("Flower answering", lambda: http_get(flower + "/")[0] == 401, timeout=120)
        assert http_get(flower + "/", auth=FLOWER_AUTH)[0] == 200
        assert http_get(flower + "/", auth="admin:wrong")[0] == 401
        assert http_get(flower + "/metrics")[0] == 401
        assert http_get(flower + "/api/workers")[0] == 401
        wait_for("the exporter answering", lambda: http_get(metrics)[0] == 401, timeout=120)
        assert http_get(metrics, auth="prometheus:wrong")[0] == 401
        status, body = http_get(metrics, auth=METRICS_AUTH)
        assert status == 200 and b"distscrape_up 1.0" in body
        # The job API, published on the host's loopback too: its jobs only with its token, the
        # dashboard's page and files (which hold no data) without.
        api = f"http://127.0.0.1:{stack.api_port}"
        wait_for("the job API answering", lambda: http_get(api + "/healthz")[0] == 200, timeout=120)
        assert http_get(api + "/api/jobs")[0] == 401
        assert http_get(api + "/api/jobs", bearer="test-api-token-wrong000")[0] == 401
        assert http_get(api + "/api/jobs", auth=FLOWER_AUTH)[0] == 401  # another service's password
        assert http_get(api + "/api/jobs", bearer=API_TOKEN) == (200, b"[]")
        status, page = http_get(api + "/")
        assert status == 200 and b"<title>distscrape jobs</title>" in page
        assert b'src="/static/dashboard.js"' in page
        status, script = http_get(api + "/static/dashboard.js")
        assert status == 200 and b"Authorization" in script

        # Seed as the compose file's header says, with the site container's address.
        t = time.monotonic()
        seeded = stack.compose("run", "--rm", "seed", JOB, f"http://{site_ip}:{SITE_PORT}/",
                               "--output", "/data/site")
        assert f"job {JOB} created" in seeded.stdout + seeded.stderr, seeded.stdout + seeded.stderr
        owners = JobKeys(JOB).owners
        client = redis.Redis(host=redis_ip, password=REDIS_PASSWORD, decode_responses=True)

        def victim():
            """A worker container holding items, once a quarter of the site is done."""
            if tracker.stats(JOB).done < PAGES // 4:
                return None
            held = {}
            for item, owner in client.hgetall(owners).items():
                held.setdefault(owner.split()[0], []).append(item)
            return next(((cid, held[wid]) for cid, wid in ids.items() if len(held.get(wid, [])) >= 2), None)

        stopped, held = wait_for("a worker holding items mid-crawl", victim, timeout=120, interval=0.05)
        assert not tracker.stats(JOB).finished
        t_stop = time.monotonic()
        engine.docker("stop", "-t", "330", stopped)  # SIGTERM via the container's init to the worker
        timings["worker container stop"] = time.monotonic() - t_stop
        state = engine.docker("inspect", "-f", "{{.State.ExitCode}} {{.State.Running}}", stopped).stdout.split()
        still = [i for i, o in client.hgetall(owners).items() if o.split()[0] == ids[stopped]]
        stats = wait_for("the crawl finished by the other worker",
                         lambda: (s := tracker.stats(JOB)).finished and s, timeout=180, interval=0.2)
        after_stop = time.monotonic() - t_stop
        timings["crawl"] = time.monotonic() - t
        logs = engine.docker("logs", "--tail", "30", stopped)
        log = logs.stdout + logs.stderr
        assert state == ["0", "false"], (state, log)
        assert not still, f"items still held by the stopped worker: {still}\n{log}"
        assert "Warm shutdown" in log, log
        assert (stats.done, stats.dead, stats.seen) == (PAGES, 0, PAGES), stats
        # Given back, not waited out: well within the lease (60 s) of the stop.
        assert after_stop < 60, after_stop

        survivor = next(c for c in workers if c != stopped)
        site = generate_site(n_pages=PAGES)  # what local_site --pages PAGES serves
        saver = FileItemSaver("/data/site")
        expected = {str(saver.name_for(f"http://{site_ip}:{SITE_PORT}{p}")): site.pages[p] for p in site.reachable}
        assert _saved(engine, survivor, "/data/site") == expected
        status, body = http_get(metrics, auth=METRICS_AUTH)
        assert f'distscrape_job_done_items_total{{job="{JOB}"}} {PAGES}.0'.encode() in body
        # The API reads the same Redis: the crawled job, with every page, and finished once a
        # worker has marked it so (a moment after its last page).
        assert http_get(api + f"/api/jobs/{JOB}")[0] == 401

        def listed():
            status, body = http_get(api + "/api/jobs", bearer=API_TOKEN)
            assert status == 200, body
            (job,) = json.loads(body)
            assert (job["job"], job["done"], job["dead"], job["seen"]) == (JOB, PAGES, 0, PAGES), job
            return job["state"] == "finished"

        wait_for("the API listing the job finished", listed, timeout=60)
        timings["total"] = time.monotonic() - started
        print(f"\nworker {ids[stopped]} held {len(held)} items when stopped; compose {tool} "
              f"({' '.join(command)}); " + "; ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.compose("down", "-v", "--remove-orphans", "-t", "5", check=False)
