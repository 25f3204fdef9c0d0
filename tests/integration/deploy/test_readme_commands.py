"""The README's and the guide's commands, run as written, in a fresh copy of the checkout and a
fresh virtualenv made by the README's own set-up command: a doc that goes false fails here.

Every command line of those two files (a line of a code block that starts with `python3 -m
venv`, `.venv/bin/` or a `VAR=value` prefix before one) is either run here or named in
ELSEWHERE with the test that runs it, so a new command in the docs fails until it is tried.
Commands that name a real site run against a site served on 127.0.0.1 instead (the URL is the
only change), or only seed, which fetches nothing.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tests.support.ops import wait_for
from distscrape_celery.testing.sitegen import SiteServer, generate_site
from tests.support import REPO_ROOT as ROOT

DOCS = (ROOT / "README.md", ROOT / "docs" / "guide.md")
COMMAND_LINE = re.compile(
    r"^\s*((?:[A-Z_]+='[^']*' )?(?:python3 -m venv|\.venv/bin/|distscrape |celery ).*)$")

# Lines run by other tests (their text is checked there against the docs).
ELSEWHERE = {
    # tests/integration/deploy/test_deploy_files.py runs the documented celery multi line.
    "celery multi start",
    # .ci/run runs the README's test command verbatim (checked below).
    "-m pytest",
    # tests/integration/savers/test_postgres_crawl.py runs the crawl into PostgreSQL.
    "DISTSCRAPE_POSTGRES_DSN=",
}

# The real site the docs crawl, and the local stand-in that replaces it.
REAL_SITE = "https://example.org/docs/"
REAL_SITE_REGEX = r"'^https://example\.org/docs/'"


def doc_commands() -> list[str]:
    """Every command line of the README and the guide, comments dropped, in order."""
    lines = []
    for doc in DOCS:
        in_block = False
        for raw in doc.read_text().splitlines():
            if raw.strip().startswith("```"):
                in_block = not in_block
                continue
            match = COMMAND_LINE.match(raw) if in_block else None
            if match:
                lines.append(re.sub(r"\s+#\s.*$", "", match.group(1)).strip())
    return list(dict.fromkeys(lines))


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the repository's files (no venv, no state), as a new user's clone."""
    dest = tmp_path_factory.mktemp("readme") / "distscrape-celery"
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "*.egg-info", "crawl-output*", "*.distscrape-state",
        ".pytest_cache", "build", "dist"))
    return dest


def shell(command: str, cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def clean_env(**extra: str) -> dict:
    """This process's environment less every distscrape and Flower setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DISTSCRAPE_", "FLOWER_", "VIRTUAL_ENV"))}
    return {**env, **extra}


def test_the_readme_and_guide_commands_work_as_written(checkout, redis_url):
    commands = doc_commands()
    # After the set-up only .venv/bin has these programs: a bare name is "command not found",
    # or another installation's.
    bare = [c for c in commands if re.match(r"^(?:[A-Z_]+='[^']*' )?(?:distscrape|celery) ", c)]
    assert bare == [], f"write these as .venv/bin/...: {bare}"
    ran: set[str] = set()

    # 1. The README's first command: a fresh venv, and a crawl of the local site end to end.
    setup = next(c for c in commands if c.startswith("python3 -m venv") and "local_site" in c)
    res = shell(setup, checkout, clean_env(), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r": 300 saved, 0 dead, 300 seen in ", res.stdout), res.stdout
    assert len([p for p in (checkout / "crawl-output").rglob("*") if p.is_file()]) == 300
    ran.add(setup)

    # 2. The README's test command is the one .ci/run runs.
    tests = next(c for c in commands if c.startswith("python3 -m venv") and "pytest" in c)
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == tests
    ran.add(tests)

    venv_env = clean_env()
    # 3. The crawl of a real site, with the local site's URL in its place.
    site = generate_site(n_pages=20, seed=3, unreachable=0)
    with SiteServer(site) as server:
        for command in [c for c in commands
                        if REAL_SITE in c and not any(e in c for e in ELSEWHERE)]:
            local = command.replace(REAL_SITE_REGEX, shlex.quote("^" + re.escape(server.url("/"))))
            local = local.replace(REAL_SITE, server.url("/"))
            res = shell(local, checkout, venv_env)
            assert res.returncode == 0, (command, res.stderr[-3000:])
            assert f": {len(site.reachable)} saved, 0 dead" in res.stdout, (command, res.stdout)
            ran.add(command)

    # 4. Seeding and job control, on a Redis of the test's: seeding fetches nothing.
    redis_env = clean_env(DISTSCRAPE_REDIS_URL=redis_url)
    for command in commands:
        words = command.split()
        if not command.startswith(".venv/bin/distscrape ") or command in ran:
            continue
        verb = words[1]
        if verb == "metrics":
            continue
        if "--watch" in words:
            out, status = watch_until(command, checkout, redis_env, "blog")
            assert "blog" in out and status in (0, 130), (command, status, out)
        else:
            res = shell(command, checkout, redis_env)
            assert res.returncode == 0, (command, res.stdout, res.stderr)
            if verb == "seed":
                assert "job blog" in res.stdout, res.stdout
        ran.add(command)
    jobs = shell(".venv/bin/distscrape jobs --json", checkout, redis_env)
    assert jobs.returncode == 0 and "blog" not in jobs.stdout, jobs.stdout  # deleted, as the guide ends
    assert (checkout / "dead.txt").exists()

    # 5. Flower and the metrics exporter, as written: they answer only with their credentials.
    for command in [c for c in commands if " flower " in c or " metrics " in c]:
        port = 5555 if " flower " in command else 9808
        auth = re.match(r"^[A-Z_]+='([^']*)'", command).group(1)
        proc = subprocess.Popen(["bash", "-c", f"exec env {command}"], cwd=checkout,
                                env=redis_env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            path = "/api/workers" if port == 5555 else "/metrics"
            wait_for(f"{command} to answer",
                     lambda: _status(port, path, auth) == 200, timeout=60)
            assert _status(port, path, None) == 401, command
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        ran.add(command)

    left = [c for c in commands if c not in ran and not any(e in c for e in ELSEWHERE)]
    assert left == [], f"commands in the docs that no test runs: {left}"


def _status(port: int, path: str, auth: str | None) -> int:
    import base64
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def watch_until(command: str, cwd: Path, env: dict, text: str, timeout: float = 120):
    """Run ``command`` on a pseudo-terminal (a live view draws only on a terminal) until its
    output shows ``text``, then Ctrl-C it: (its output, its exit status)."""
    import pty
    import select

    leader, follower = pty.openpty()
    proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdin=follower,
                            stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while text.encode() not in out and time.monotonic() < deadline and proc.poll() is None:
            if select.select([leader], [], [], 0.5)[0]:
                try:
                    out += os.read(leader, 65536)
                except OSError:  # the program closed the terminal
                    break
        proc.send_signal(signal.SIGINT)
        status = proc.wait(30)
    finally:
        proc.kill()
        os.close(leader)
    return out.decode(errors="replace"), status
