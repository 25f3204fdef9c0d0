"""A Docker engine of the tests' own, and the images the Docker stack's test runs on.

:class:`DockerEngine` starts Debian's ``dockerd`` as root with no default bridge and no iptables
rules, its networks drawn from 10.213.64.0/18, its socket, exec root and pid file in a temporary
directory, so it clashes with no other engine on the machine. Its data root persists (default
/var/tmp/distscrape-test-docker, or DISTSCRAPE_TEST_DOCKER_ROOT): the images built there are the
cache that makes a second run quick. :func:`base_image` makes a stand-in for ``python:3.12-slim``
and ``redis:7.2`` from Debian's packages with debootstrap, where Docker Hub cannot be reached.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from distscrape_celery.lifecycle import die_with_parent

ADDRESS_POOL = "base=10.213.64.0/18,size=24"
DATA_ROOT = Path(os.environ.get("DISTSCRAPE_TEST_DOCKER_ROOT", "/var/tmp/distscrape-test-docker"))
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SUITE = "bookworm"
# What the stand-in base holds: Python and pip for docker/Dockerfile, redis-server for compose's
# Redis. Its tag names a hash of this recipe, so a change makes a new one.
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "redis-server", "ca-certificates")


class EngineUnavailable(Exception):
    """No Docker engine can be started here; the message says why."""


class DockerEngine:
    """``dockerd`` started for the tests (a context manager); :meth:`docker` runs the client
    against it."""

    def __init__(self, data_root: Path = DATA_ROOT) -> None:
        self.data_root = data_root
        self.run_dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self._lock_file = None

    @property
    def env(self) -> dict[str, str]:
        assert self.run_dir is not None
        # DOCKER_BUILDKIT=0: Debian's engine builds with its classic builder; BuildKit needs the
        # buildx plug-in, which Debian 12 does not ship with docker.io.
        return {**os.environ, "DOCKER_HOST": f"unix://{self.run_dir}/docker.sock", "DOCKER_BUILDKIT": "0",
                "COMPOSE_DOCKER_CLI_BUILD": "0"}

    def __enter__(self) -> "DockerEngine":
        dockerd, docker = shutil.which("dockerd"), shutil.which("docker")
        if os.geteuid() != 0:
            raise EngineUnavailable("starting a Docker engine needs root (CI runs as root)")
        if not (dockerd and docker):
            raise EngineUnavailable("dockerd or docker is not installed (.ci/run installs Debian's docker.io)")
        self.data_root.mkdir(parents=True, exist_ok=True)
        # One engine on this data root at a time: a second run waits for the first.
        self._lock_file = open(self.data_root.parent / f".{self.data_root.name}.lock", "w")
        fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        self.run_dir = Path(tempfile.mkdtemp(prefix="ds-docker-"))
        log = (self.run_dir / "dockerd.log").open("wb")
        self.proc = subprocess.Popen(
            [dockerd, "--bridge=none", "--iptables=false", "--ip6tables=false",
             "--default-address-pool", ADDRESS_POOL, "--data-root", str(self.data_root),
             "--exec-root", str(self.run_dir / "exec"), "--pidfile", str(self.run_dir / "docker.pid"),
             "--host", f"unix://{self.run_dir}/docker.sock"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            # A test run killed outright takes its engine along: none is left on the data root.
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        deadline = time.monotonic() + 60
        while self.docker("version", check=False, timeout=20).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.__exit__()
                raise EngineUnavailable(f"dockerd did not start: {tail}")
            time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return (self.run_dir / "dockerd.log").read_text(errors="replace")[-chars:]
        except (OSError, TypeError):
            return ""

    def docker(self, *args: str, check: bool = True, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
        """``docker ARGS`` against this engine; output captured as text."""
        res = subprocess.run([shutil.which("docker") or "docker", *args], env=self.env, capture_output=True,
                             text=True, timeout=timeout, **kw)
        if check and res.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return res

    def has_image(self, name: str) -> bool:
        return self.docker("image", "inspect", name, check=False, timeout=60).returncode == 0

    def compose_command(self, tool: str) -> list[str]:
        """The command line of a compose tool: ``"v2"`` is ``docker compose`` (the plug-in),
        ``"v1.29"`` is ``docker-compose`` (Debian 12's); an AssertionError where it is missing."""
        if tool == "v2":
            if self.docker("compose", "version", check=False, timeout=60).returncode != 0:
                raise AssertionError("docker compose (v2) is not installed: .ci/run puts the plug-in from "
                                     "Debian 13's docker-compose package in /usr/local/lib/docker/cli-plugins")
            return [shutil.which("docker") or "docker", "compose"]
        if tool == "v1.29":
            legacy = shutil.which("docker-compose")
            if legacy is None:
                raise AssertionError("docker-compose (1.29) is not installed "
                                     "(.ci/run installs Debian's docker-compose)")
            return [legacy]
        raise ValueError(f"unknown compose tool {tool!r}: v2 or v1.29")


def base_image(engine: DockerEngine) -> tuple[str, float]:
    """The stand-in base image's name, built now unless the engine has it, and the seconds its
    build took (0 when cached). The machine's CA bundle goes in, so that pip in a build
    reaches the package index through whatever this machine trusts."""
    recipe = f"{DEBIAN_SUITE} {DEBIAN_MIRROR} {' '.join(BASE_PACKAGES)} v1"
    name = f"distscrape-test/base:{DEBIAN_SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"
    if engine.has_image(name):
        return name, 0.0
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise AssertionError("debootstrap is not installed (.ci/run installs it): the base image "
                             "is made from Debian's packages")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=engine.data_root.parent, prefix="ds-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run([debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                        DEBIAN_SUITE, str(root), DEBIAN_MIRROR],
                       check=True, capture_output=True, timeout=1200)
        # As in python:3.12-slim, pip installs into the image's Python (Debian marks it
        # externally managed).
        for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        shutil.copy2("/etc/ssl/certs/ca-certificates.crt", root / "etc/ssl/certs/ca-certificates.crt")
        (root / "data").mkdir(exist_ok=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        # redis:7.2 works in /data, where compose mounts its volume and redis.conf keeps the AOF.
        subprocess.run([shutil.which("docker") or "docker", "import",
                        "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        "--change", "ENV LANG=C.UTF-8", "--change", "WORKDIR /data",
                        "--change", 'CMD ["bash"]', "-", name],
                       stdin=tar.stdout, env=engine.env, check=True, capture_output=True, timeout=600)
        tar.stdout.close()
        assert tar.wait(60) == 0
    return name, time.monotonic() - started
