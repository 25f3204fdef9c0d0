"""`distscrape seed --priority`, `--priority-rule` and `--max-duration`: they reach the tracker
and the stored spec, and a bad value is an error naming the option. The command runs as a
subprocess against a real Redis."""

from __future__ import annotations

from distscrape_celery.job.spec import JobSpec
from distscrape_celery.tracker import RedisTracker
from tests.support.cli import assert_one_line_error, run
from tests.support.tracker_state import item_states

RANK = 2**24  # a live value's rank: priority * 2**24 + depth


def test_seeds_are_queued_at_their_priority(redis_url, tmp_path) -> None:
    out = ["--output", str(tmp_path / "o"), "--redis-url", redis_url]
    res = run("seed", "p", "http://a.invalid/1", "http://a.invalid/2", "--priority", "7", *out)
    assert res.returncode == 0, res.stderr
    # An existing job takes more seeds at another priority: --priority is no spec option.
    res = run("seed", "p", "http://a.invalid/3", "--priority", "-3", "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    assert run("seed", "p", "http://a.invalid/4", "--redis-url", redis_url).returncode == 0
    tracker = RedisTracker.from_url(redis_url)
    states = item_states(tracker.client, "p", [f"http://a.invalid/{n}" for n in range(1, 5)])
    assert states == [f"q{7 * RANK}", f"q{7 * RANK}", f"q{-3 * RANK}", "q0"]
    assert "priority" not in tracker.load_spec("p")


def test_priority_rule_and_max_duration_reach_the_spec(redis_url, tmp_path) -> None:
    res = run("seed", "rules", "http://a.invalid/", "--output", str(tmp_path / "o"),
              "--priority-rule", "depth-first", "--max-duration", "90", "--redis-url", redis_url)
    assert res.returncode == 0, res.stderr
    tracker = RedisTracker.from_url(redis_url)
    spec = JobSpec.from_json(tracker.load_spec("rules"))
    assert (spec.priority.rule, spec.politeness.max_duration) == ("depth-first", 90.0)
    assert tracker.client.hget("ds:{rules}:control", "max_duration") == "90.0"


def test_bad_priorities_are_errors_naming_the_option(redis_url, tmp_path) -> None:
    res = run("seed", "bad", "http://a.invalid/", "--priority", "1001", "--redis-url", redis_url)
    assert res.returncode == 2 and "'--priority'" in res.stderr and "1000" in res.stderr, res.stderr
    res = run("seed", "bad", "http://a.invalid/", "--max-duration", "0", "--redis-url", redis_url)
    assert res.returncode == 2 and "'--max-duration'" in res.stderr, res.stderr
    for rule, fragment in [
        ("newest-first", "--priority-rule: unknown rule 'newest-first'"),
        ("tests.plugins.priorities:shallow_path", "--priority-rule: "),
    ]:
        res = run("seed", "bad", "http://a.invalid/", "--output", str(tmp_path / "o"),
                  "--priority-rule", rule, "--redis-url", redis_url)
        assert_one_line_error(res, fragment)
    assert "not allowed" in res.stderr
    res = run("seed", "ok", "http://a.invalid/", "--output", str(tmp_path / "o"),
              "--priority-rule", "tests.plugins.priorities:shallow_path", "--redis-url", redis_url,
              env={"DISTSCRAPE_PLUGIN_MODULES": "tests.plugins"})
    assert res.returncode == 0, res.stderr
    assert RedisTracker.from_url(redis_url).jobs() == ["ok"]
