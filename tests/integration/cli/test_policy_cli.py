"""The policy options of `distscrape seed`: they reach the stored spec over a job file's values,
and a bad one is a one-line error. The command runs as a subprocess against a real Redis."""

from __future__ import annotations

from distscrape_celery.job.spec import JobSpec
from distscrape_celery.tracker import RedisTracker
from tests.support.cli import assert_one_line_error, run


def test_policy_options_reach_the_spec(redis_url, tmp_path) -> None:
    config = tmp_path / "job.toml"
    config.write_text('[fetch]\nuser_agent = "from-file/1"\n[scraper]\nmax_depth = 5\n')
    common = ["http://www.site.invalid/", "--output", str(tmp_path / "o"), "--config", str(config),
              "--redis-url", redis_url]
    res = run("seed", "flags", *common, "--ignore-robots", "--user-agent", "bot/2 (+x)",
              "--max-depth", "2", "--allow-domain", "site.invalid", "--allow-domain",
              "other.invalid", "--allow-private")
    assert res.returncode == 0, res.stderr
    tracker = RedisTracker.from_url(redis_url)
    spec = JobSpec.from_json(tracker.load_spec("flags"))
    assert (spec.fetch.obey_robots, spec.fetch.user_agent, spec.fetch.allow_private) == (
        False, "bot/2 (+x)", True)
    assert (spec.scraper.max_depth, spec.scraper.allowed_domains) == (
        2, ["site.invalid", "other.invalid"])
    assert run("seed", "file", *common).returncode == 0
    spec = JobSpec.from_json(tracker.load_spec("file"))  # without flags, the file's values stand
    assert (spec.fetch.obey_robots, spec.fetch.user_agent, spec.scraper.max_depth) == (
        True, "from-file/1", 5)
    assert spec.fetch.allow_private is False and spec.scraper.allowed_domains is None


def test_bad_policy_options_are_one_line_errors(redis_url) -> None:
    for args, fragment in [
        (["--allow-domain", "http://x.invalid/"], "--allow-domain: 'http://x.invalid/' is not a domain name"),
        (["--allow-domain", "x.invalid", "--all-hosts"], "exclude each other"),
    ]:
        res = run("seed", "bad", "http://x.invalid/", *args, "--redis-url", redis_url)
        assert_one_line_error(res, fragment)
