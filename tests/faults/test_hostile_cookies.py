"""Set-Cookie headers a site sends that are malformed, huge or hostile: the page is done, the job's
jar (real Redis) stays within its bounds, and nothing a site sends makes the jar raise. Real
HTTP on 127.0.0.1, the real item pipeline."""

from __future__ import annotations

import time

import pytest
import redis
from hypothesis import HealthCheck, given, settings, strategies as st
from urllib3 import HTTPHeaderDict

from distscrape_celery.web.cookies import MAX_COOKIE_SECONDS, JobCookies, RedisCookieStore
from tests.faults.test_hostile_headers import crawl_one

HOSTILE = [
    "a=1; Max-Age=" + "9" * 400, "b=2; Expires=Fri, 31 Dec 9999 23:59:59 GMT",
    "c=3; Max-Age=-" + "9" * 40, "d=" + "x" * 10_000, "=; ;; =", "e=\x00\x7f; Path=\x01",
    "f=1; Domain=.", "g=1; Domain=127.0.0.1.evil.example", "h=1; Version=99; Port=\"x,y\"",
    "i=1; Expires=not a date", "j=" + "é" * 50,
]


def hostile(handler) -> None:
    handler.send_response(200)
    for value in HOSTILE:
        handler.send_header("Set-Cookie", value)
    handler.send_header("Set-Cookie2", "k=1; Version=1; Max-Age=" + "9" * 50)
    handler.send_header("Content-Type", "text/html")
    handler.send_header("Content-Length", "2")
    handler.end_headers()
    handler.wfile.write(b"ok")


# pytest shows every warning; a worker ignores this one (web/cookies.py)
@pytest.mark.filterwarnings("ignore:http.cookiejar bug")
def test_hostile_set_cookie_headers_leave_the_page_done(redis_url, tmp_path):
    rt, url = crawl_one(redis_url, tmp_path, {"/": hostile}, "/", "hostile-cookies",
                        fetch={"cookies": True, "allow_private": True})
    assert rt.tracker.dead_items("hostile-cookies") == {}
    assert rt.tracker.stats("hostile-cookies").done == 1
    jar = JobCookies(RedisCookieStore(redis.Redis.from_url(redis_url)), "hostile-cookies",
                     per_domain=50, max_bytes=1 << 20)
    sent = dict(pair.split("=", 1) for pair in jar.header(url).split("; "))
    # A Max-Age past any date costs its cookie; an expiry too far is cut to 400 days; the
    # expired and the oversized are not kept; the rest of the response's cookies are.
    assert "a" not in sent and sent["b"] == "2" and "c" not in sent and "d" not in sent
    assert sent["i"] == "1"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    stored = client.hget("ds:{hostile-cookies}:cookies", "127.0.0.1")
    assert stored is not None
    import json
    expiries = [c["expires"] for c in json.loads(stored).values() if c["expires"] is not None]
    assert expiries and max(expiries) <= time.time() + MAX_COOKIE_SECONDS + 5


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(st.characters(codec="latin-1"), max_size=80), min_size=1, max_size=4))
def test_no_set_cookie_makes_the_jar_raise(redis_url, values):
    jar = JobCookies(RedisCookieStore(redis.Redis.from_url(redis_url)), "fuzz",
                     per_domain=3, max_bytes=2048)
    headers = HTTPHeaderDict()
    for value in values:
        headers.add("Set-Cookie", value)
    jar.receive("http://a.example.org/x/y", headers)
    jar.header("http://a.example.org/x/y")
    client = redis.Redis.from_url(redis_url)
    assert int(client.get("ds:{fuzz}:cookie-bytes") or 0) <= 2048
