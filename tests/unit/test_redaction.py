"""No password or token of a configured URL is ever printed: one redaction for every URL shown,
and the forms a password takes in it (the messages of `distscrape` that show such URLs:
integration/test_redaction_cli.py). No control character a site sent is printed or logged as it
is: one escape, and every log record of a process escaped (a real crawl's output and worker log:
faults/test_terminal_escapes.py)."""

from __future__ import annotations

import io
import logging

import pytest

from distscrape_celery.redaction import escape, escape_log_records, redact
from distscrape_celery.tracker.redis.items import MAX_REASON, stored_reason
from distscrape_celery.errors import ConfigError
from distscrape_celery.redis_urls import check_redis_url
from distscrape_celery.settings import Settings

SECRET = "s3cret"


@pytest.mark.parametrize("url, shown", [
    ("redis://:s3cret@10.0.0.5:6379/2", "redis://:***@10.0.0.5:6379/2"),
    ("redis://crawler:s3cret@10.0.0.5/0", "redis://crawler:***@10.0.0.5/0"),
    ("rediss://crawler:s3cret@10.0.0.5:6380/0", "rediss://crawler:***@10.0.0.5:6380/0"),
    # Raw '/', '@', ':', '?' and '#' in the password: where a URL parser would end the host part.
    ("redis://:s3/cret@10.0.0.5/2", "redis://:***@10.0.0.5/2"),
    ("redis://:s3@cr@et@10.0.0.5/2", "redis://:***@10.0.0.5/2"),
    ("redis://crawler:s3:cr:et@10.0.0.5/2", "redis://crawler:***@10.0.0.5/2"),
    ("redis://:s3?cret@10.0.0.5/2", "redis://:***@10.0.0.5/2"),
    ("redis://:s3#cret@10.0.0.5/2", "redis://:***@10.0.0.5/2"),
    ("redis://:s3%2Fcret@10.0.0.5/2", "redis://:***@10.0.0.5/2"),
    # Only a user: that may be the secret itself (a token).
    ("redis://s3cret@10.0.0.5/0", "redis://***@10.0.0.5/0"),
    ("amqp://guest:s3cret@rabbit:5672//", "amqp://guest:***@rabbit:5672//"),
    ("AMQPS://guest:s3cret@rabbit//", "AMQPS://guest:***@rabbit//"),
    # Secrets in the query, whatever the case of the parameter's name.
    ("redis://10.0.0.5/2?password=s3cret", "redis://10.0.0.5/2?password=***"),
    ("redis://10.0.0.5/2?db=1&password=s3cret&ssl=no", "redis://10.0.0.5/2?db=1&password=***&ssl=no"),
    ("unix:///run/redis.sock?db=2&PassWord=s3cret", "unix:///run/redis.sock?db=2&PassWord=***"),
    ("redis://10.0.0.5/?passwd=s3cret&pass=s3cret", "redis://10.0.0.5/?passwd=***&pass=***"),
    ("http://h/x?token=s3cret&secret=s3cret&api_key=s3cret&a=1",
     "http://h/x?token=***&secret=***&api_key=***&a=1"),
    ("redis://u:s3cret@10.0.0.5/0?password=s3cret", "redis://u:***@10.0.0.5/0?password=***"),
])
def test_every_form_of_a_password_is_hidden(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert "s3" not in redact(url)  # nor any piece of it


@pytest.mark.parametrize("text", [
    "redis://127.0.0.1:6379/0", "unix:///run/redis.sock?db=2", "/srv/crawl/out", "out.tar.gz",
    "amqp://rabbit:5672//", "http://example.org/a?page=2", "", "not a url",
])
def test_what_holds_no_secret_is_shown_as_it_is(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("url", [
    "redis://:s3/cret@127.0.0.1:6379/2", "redis://:1/s3cret@127.0.0.1/2",
    "unix://:s3/cret@/run/redis.sock",
])
def test_a_raw_slash_in_a_redis_password_is_named_not_shown(url: str) -> None:
    with pytest.raises(ValueError) as info:
        check_redis_url(url)
    message = str(info.value)
    assert "cret" not in message and "percent-encode" in message, message


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0?password=s3cret",
    "redis://127.0.0.1:6379/0?db=1&username=u&password=s3cret",
])
def test_credentials_in_a_redis_urls_query_are_refused_with_the_way_that_works(url: str) -> None:
    """kombu (the Celery broker) fails with a TypeError on a ?password= query, so a worker given
    such a URL would crash at start: refuse it up front, naming the user-info form instead."""
    with pytest.raises(ValueError, match=r"redis://:PASSWORD@host") as info:
        check_redis_url(url)
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigError, match="DISTSCRAPE_REDIS_URL"):
        Settings.from_env({"DISTSCRAPE_REDIS_URL": url})


# -- control characters ------------------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    ("x-a:///\x1b]0;PWNED\x07\x1b[2J", r"x-a:///\x1b]0;PWNED\x07\x1b[2J"),  # OSC title, clear
    ("a\x00b\x08c\x7fd", r"a\x00b\x08c\x7fd"),  # C0, backspace, DEL
    ("line\nfake line\r\tx", r"line\x0afake line\x0d\x09x"),  # no forged log lines
    ("\x9b31m\x85\x80", r"\x9b31m\x85\x80"),  # C1: CSI, NEL
    ("evil\u202etxt.exe", r"evil\u202etxt.exe"),  # right-to-left override
    ("\u2066a\u2069\u200e\u061c", r"\u2066a\u2069\u200e\u061c"),  # bidi isolates and marks
    ("pay\u200bpal\ufeff\u2060", r"pay\u200bpal\ufeff\u2060"),  # zero-width, BOM, joiner
    ("a\u2028b\u2029c", r"a\u2028b\u2029c"),  # line and paragraph separators
    ("tag\U000e0041", r"tag\U000e0041"),  # an invisible tag character
    ("\udcff", r"\udcff"),  # a lone surrogate (from surrogateescape)
])
def test_controls_and_format_characters_are_escaped_visibly(text: str, shown: str) -> None:
    assert escape(text) == shown
    assert escape(shown) == shown  # escaped where stored and again where shown: no change


@pytest.mark.parametrize("text", [
    "café crème", "東京の天気", "Привет, мир", "مرحبا", "🙂 emoji", "a\u00a0b\u3000c",
    "http://example.org/h/%C3%BCber?q=1", r"C:\path\x1b as typed", "",
])
def test_ordinary_text_of_any_script_is_shown_as_it_is(text: str) -> None:
    assert escape(text) == text


def test_a_stored_reason_is_escaped_then_cut() -> None:
    assert stored_reason("redirect to \x1b[2J") == r"redirect to \x1b[2J"
    long = stored_reason("\x1b" * MAX_REASON)
    assert len(long) == MAX_REASON and "\x1b" not in long


def test_every_log_record_of_the_process_is_escaped_message_and_traceback() -> None:
    """Whatever logger and handler: the formatted message and the traceback show escapes; the
    traceback keeps its line breaks."""
    escape_log_records()
    escape_log_records()  # idempotent: one factory, not two
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("tests.escapes.third_party")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("%s: bad Content-Type %s", "http://h.invalid/\x1b[2J", "text/\x07html")
        try:
            raise ValueError("Location \x1b]0;PWNED\x07 from http://h.invalid/\u202e")
        except ValueError:
            logger.exception("fetch of %s raised", "http://h.invalid/\x9b")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert not any(c in out for c in "\x1b\x07\x9b\u202e"), repr(out)
    lines = out.splitlines()
    assert lines[0] == r"http://h.invalid/\x1b[2J: bad Content-Type text/\x07html"
    assert lines[1] == r"fetch of http://h.invalid/\x9b raised"
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == r"ValueError: Location \x1b]0;PWNED\x07 from http://h.invalid/\u202e"
