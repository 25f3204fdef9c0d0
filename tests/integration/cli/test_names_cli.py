"""Names and hosts given to `distscrape seed` (a subprocess, against a real Redis): a bad job
name, allowed domain or seed host is a one-line error naming it, and a seed file's too-long line is
reported by its number while the other lines are seeded."""

from __future__ import annotations

from tests.support.cli import assert_one_line_error, run

from distscrape_celery.job.seeds import MAX_LINE_BYTES


def test_the_seed_command_refuses_a_job_name_ending_in_a_newline(redis_url) -> None:
    res = run("seed", "job\n", "http://127.0.0.1:9/", "--redis-url", redis_url)
    assert_one_line_error(res, "invalid job name 'job\\n'")


def test_the_allow_domain_option_is_named_in_its_error(redis_url) -> None:
    res = run("seed", "bad", "http://x.invalid/", "--allow-domain", "x.invalid:8080",
              "--redis-url", redis_url)
    assert_one_line_error(res, "--allow-domain: 'x.invalid:8080' is not a domain name", "no port")


def test_the_seed_command_names_a_seed_with_a_bad_host(redis_url) -> None:
    res = run("seed", "j", "http://a..b/", "--redis-url", redis_url)
    assert_one_line_error(res, "malformed seed URL 'http://a..b/'", "invalid host name")


def test_the_seed_command_reports_a_too_long_line_and_seeds_the_rest(redis_url, tmp_path) -> None:
    path = tmp_path / "ids.txt"
    path.write_bytes(b"1\n" + b"7" * (4 * 1024 * 1024) + b"\n2\n")
    res = run("seed", "ids", "--ids-file", str(path), "--scraper", "ids", "--id-regex", "x",
              "--download-url-fmt", "http://127.0.0.1:9/{}", "--output", str(tmp_path / "o"),
              "--redis-url", redis_url)
    assert res.returncode == 1, res.stderr
    assert "created: 2 new item(s)" in res.stdout
    assert f"{path}:2: longer than {MAX_LINE_BYTES} bytes; skipped" in res.stderr
    assert "1 malformed line(s)" in res.stderr
