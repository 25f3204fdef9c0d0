"""A worker process sends a link to the tracker once: a link it passed to the tracker before (for
the same creation of the job) is not sent again, since the tracker holds it for good. Real
Redis, real HTTP on 127.0.0.1, the real pipeline; a wrapper around the tracker's ``scraped``
records what each call carried and then makes it."""

from __future__ import annotations

import pytest

from tests.support.http import RouteServer
from tests.support.memory import retained_after
from tests.support.pipeline import pipeline_env
from tests.support.tracker_state import item_states, live_items

from distscrape_celery.errors import TrackerUnavailable
from distscrape_celery.job.spec import build_spec

NAV = [f"/nav{n}" for n in range(6)]
# Room for every page of the site in flight: these tests scrape pages one after the other while
# what they link to waits, dispatched.
POLITE = {"per_domain_concurrency": 64}


def page(*hrefs: str) -> bytes:
    return ("<html>" + "".join(f'<a href="{h}">x</a>' for h in hrefs) + "</html>").encode()


# Every page links to the six navigation pages and to one page of its own.
ROUTES = {
    "/ok": (200, page(*NAV)),
    **{f"/p{n}": (200, page(*NAV, f"/leaf{n}")) for n in range(8)},
    **{path: (200, page(*NAV)) for path in NAV},
}


@pytest.fixture
def site():
    with RouteServer(ROUTES) as server:
        yield server


def recording(rt, monkeypatch, fail_first: int = 0):
    """The found links of every call of the tracker's ``scraped`` (the call is made after, unless
    it is one of the first ``fail_first``, which raise as if Redis were away)."""
    calls: list[list[str]] = []
    real = rt.tracker.scraped

    def scraped(job, item, token, found=(), *args, **kwargs):
        calls.append([x.rsplit("/", 1)[1] for x in found])
        if len(calls) <= fail_first:
            raise TrackerUnavailable("Redis is away (test)")
        return real(job, item, token, found, *args, **kwargs)

    monkeypatch.setattr(rt.tracker, "scraped", scraped)
    return calls


def scrape(rt, pipe, server, path: str) -> str:
    url = server.base + path
    rt.tracker.add("p", [url])
    return pipe.scrape("p", url)


def test_a_link_is_sent_once_and_still_queued(redis_url, site, tmp_path, monkeypatch):
    rt, pipe, rec, server = pipeline_env(redis_url, site, tmp_path, POLITE)
    calls = recording(rt, monkeypatch)
    for n in range(3):
        assert scrape(rt, pipe, server, f"/p{n}") == "scraped"
    nav = [p[1:] for p in NAV]
    assert calls == [[*nav, "leaf0"], ["leaf1"], ["leaf2"]]
    # Whatever was not sent again is in the tracker all the same: the three pages, the six
    # navigation pages and the three leaves, each once.
    assert rt.tracker.stats("p").seen == 3 + 6 + 3
    links = [server.base + p for p in [*NAV, "/leaf0", "/leaf1", "/leaf2"]]
    assert all(item_states(rt.tracker.client, "p", links)), live_items(rt.tracker.client, "p")


def test_links_of_a_call_that_failed_are_sent_again(redis_url, site, tmp_path, monkeypatch):
    rt, pipe, rec, server = pipeline_env(redis_url, site, tmp_path, POLITE)
    calls = recording(rt, monkeypatch, fail_first=1)
    with pytest.raises(TrackerUnavailable):
        scrape(rt, pipe, server, "/p0")
    assert scrape(rt, pipe, server, "/p1") == "scraped"
    nav = [p[1:] for p in NAV]
    assert calls == [[*nav, "leaf0"], [*nav, "leaf1"]]
    assert rt.tracker.stats("p").seen == 2 + 6 + 1


def test_a_job_created_again_gets_every_link(redis_url, site, tmp_path, monkeypatch):
    """The same name, another creation: the links sent to the first are sent to the second."""
    rt, pipe, rec, server = pipeline_env(redis_url, site, tmp_path, POLITE)
    calls = recording(rt, monkeypatch)
    assert scrape(rt, pipe, server, "/p0") == "scraped"
    assert rt.tracker.delete_job("p")
    spec = build_spec({"seeds": [server.base + "/p1"], "saver": {"output": str(tmp_path / "o2")},
                       "politeness": POLITE})
    rt.tracker.create_job("p", spec.to_json(), spec.crawl_limits())
    assert scrape(rt, pipe, server, "/p1") == "scraped"
    nav = [p[1:] for p in NAV]
    assert calls == [[*nav, "leaf0"], [*nav, "leaf1"]]
    assert rt.tracker.stats("p").seen == 1 + 6 + 1


def test_zero_bytes_sends_every_link(redis_url, site, tmp_path, monkeypatch):
    rt, pipe, rec, server = pipeline_env(redis_url, site, tmp_path, POLITE, known_links_bytes=0)
    calls = recording(rt, monkeypatch)
    for n in range(2):
        assert scrape(rt, pipe, server, f"/p{n}") == "scraped"
    nav = [p[1:] for p in NAV]
    assert calls == [[*nav, "leaf0"], [*nav, "leaf1"]]


def test_what_is_remembered_stays_within_its_bytes(redis_url, site, tmp_path, monkeypatch):
    """Room for about four links: the oldest are forgotten, and so sent again."""
    budget = 4 * (200 + 64 + 80)
    rt, pipe, rec, server = pipeline_env(redis_url, site, tmp_path, POLITE, known_links_bytes=budget)
    calls = recording(rt, monkeypatch)
    for n in range(3):
        assert scrape(rt, pipe, server, f"/p{n}") == "scraped"
        assert 0 < pipe.known_links.bytes <= budget
    assert all(len(c) > 1 for c in calls), calls  # each page sent some navigation links again
    assert rt.tracker.stats("p").seen == 3 + 6 + 3


def test_the_bytes_reckoned_are_the_bytes_held(redis_url, site, tmp_path):
    """Each page's task gets its own job and creation strings (from its message and its
    checkout's reply): the entries must not keep one copy of each apiece, which the reckoning
    does not count."""
    rt, pipe, rec, server = pipeline_env(redis_url, site, tmp_path, POLITE)
    links = [f"http://site.invalid/section/page{n}.html" for n in range(3000)]

    def remember() -> None:
        for n, link in enumerate(links):
            # Strings made afresh, as a decoded message and a reply make them.
            job, created = "".join(["job-", "p"]), "".join(["1764284400.", str(123456)])
            pipe.known_links.remember(job, created, [link])

    held = retained_after(remember)
    assert len(pipe.known_links) == len(links)
    print(f"\nheld {held} bytes, reckoned {pipe.known_links.bytes}")
    assert held <= pipe.known_links.bytes, (held, pipe.known_links.bytes)
