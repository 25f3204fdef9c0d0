"""Names and hosts a user gives: job names, the queue prefix, allowed domains, the hosts of seed
URLs, and the lines of a seed file. Each bad one is refused with an error naming the field (as
`distscrape seed` shows it: integration/test_names_cli.py)."""

from __future__ import annotations

import io
import tracemalloc

import pytest

from distscrape_celery.errors import ConfigError
from distscrape_celery.job.spec import build_spec
from distscrape_celery.tracker.keys import check_job_name
from distscrape_celery.web.scope import LinkScope
from distscrape_celery.job.seeds import MAX_LINE_BYTES, SeedFile
from distscrape_celery.settings import Settings

# -- job names and the queue prefix -----------------------------------------------------------


@pytest.mark.parametrize("name", ["job\n", "job\r\n", "a" * 100 + "\n", "\njob", "job\x00"])
def test_a_job_name_with_a_line_break_or_control_character_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid job name"):
        check_job_name(name)
    assert check_job_name("job-1.a_b") == "job-1.a_b"


@pytest.mark.parametrize("prefix", ["distscrape\n", "distscrape\r\n", "\ndistscrape"])
def test_a_queue_prefix_with_a_line_break_is_refused(prefix: str) -> None:
    with pytest.raises(ConfigError, match="DISTSCRAPE_QUEUE_PREFIX"):
        Settings.from_env({"DISTSCRAPE_QUEUE_PREFIX": prefix})
    assert Settings.from_env({"DISTSCRAPE_QUEUE_PREFIX": "crawl-2.a"}).queue_prefix == "crawl-2.a"


# -- allowed domains --------------------------------------------------------------------------

def domains(*given: str) -> list[str]:
    spec = build_spec({"seeds": ["http://x.invalid/"], "scraper": {"allowed_domains": list(given)}})
    return spec.scraper.allowed_domains


@pytest.mark.parametrize("domain, why", [
    ("example.org:8080", "no port"),
    ("*.example.org", "no wildcard"),
    ("%41", "no percent-escape"),
    ("exa%2Emple.org", "no percent-escape"),
    ("a..b", "empty label"),
    ("exa mple.org", "not a host name"),
    ("a/b", "no scheme, port or path"),
    ("user@example.org", "not a host name"),
    ("a" * 64 + ".org", "label longer than 63"),
    ("", "empty"),
    ("[::1]:8080", "no port"),
])
def test_an_allowed_domain_that_could_never_match_is_refused(domain: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        domains(domain)
    message = str(info.value)
    assert "scraper.allowed_domains" in message and why in message, message


def test_allowed_domains_are_kept_in_the_form_link_hosts_take() -> None:
    assert domains("Example.ORG", "example.org.", "bücher.de", "10.0.0.1", "a_b.example",
                   "[::1]", "0:0::1") == [
        "example.org", "example.org", "xn--bcher-kva.de", "10.0.0.1", "a_b.example", "::1", "::1"]
    scope = LinkScope.from_spec(build_spec({"seeds": ["http://x.invalid/"],
                                            "scraper": {"allowed_domains": ["Bücher.de"]}}))
    assert scope.accept("http://www.bücher.de/a") == "http://www.xn--bcher-kva.de/a"


# -- hosts of seed URLs -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", [
    "http://exa mple.com/", "http://a..b/", "http://.a/", "http://exa%20mple.com/",
    "http://*.example.com/", "http://" + "a" * 64 + ".com/", "http://a%2Fb/",
])
def test_a_seed_with_an_invalid_host_is_refused_by_name(seed: str) -> None:
    with pytest.raises(ConfigError, match="malformed seed URL .*invalid host name"):
        build_spec({"seeds": [seed]})


@pytest.mark.parametrize("seed, item", [
    ("http://Example.COM/", "http://example.com/"), ("http://a_b.example/", "http://a_b.example/"),
    ("http://example.org./", "http://example.org./"), ("http://[::1]:8080/", "http://[::1]:8080/"),
    ("http://bücher.de/", "http://xn--bcher-kva.de/"), ("http://10.0.0.1/", "http://10.0.0.1/"),
])
def test_valid_seed_hosts_are_taken(seed: str, item: str) -> None:
    assert build_spec({"seeds": [seed]}).seeds == [item]


# -- lines of a seed file ---------------------------------------------------------------------

def test_a_seed_file_line_is_bounded_and_a_longer_one_skipped_by_number() -> None:
    """A 32 MiB line is read a bounded piece at a time and reported by its number; the lines
    around it are seeds as ever."""
    huge = 32 * 1024 * 1024
    data = b"1\n" + b"9" * huge + b"\n2\n" + b"x" * (MAX_LINE_BYTES + 1) + b"\n3\n" \
        + b"y" * MAX_LINE_BYTES + b"\r\n"
    bad = []
    reader = SeedFile(io.BufferedReader(io.BytesIO(data)), "ids", bad.append)
    tracemalloc.start()
    try:
        seeds = list(reader)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seeds == ["1", "2", "3"]
    assert [(b.number, b.reason) for b in bad] == [
        (2, f"longer than {MAX_LINE_BYTES} bytes"), (4, f"longer than {MAX_LINE_BYTES} bytes"),
        (6, "malformed seed ID 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"
            "yyyyyyyyyyyyyyyyyyyyyyyyyyyyy'...: longer than 256 characters"),
    ]
    assert reader.bytes_read == len(data) and reader.bad == 3
    assert peak < huge // 8, peak


