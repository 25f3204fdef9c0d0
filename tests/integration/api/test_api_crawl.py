"""A job created over the job API is crawled by real Celery workers from a loopback site, its
stream reporting progress to the end, and paused, resumed, cancelled, deleted and its dead
items retried over HTTP, each seen in Redis."""

from __future__ import annotations

import time

from distscrape_celery.local.processes import wait_for_workers
from distscrape_celery.testing.sitegen import SiteServer
from distscrape_celery.tracker import JobState, RedisTracker
from tests.support.api import ApiServer, EventStream
from tests.support.crawl import crawl_settings, expected_files, saved_files, wait_until


def _spec(server, out, *seeds: str) -> str:
    listed = ", ".join(f'"{s}"' for s in (server.url("/"), *seeds))
    return (f"seeds = [{listed}]\n[saver]\noutput = \"{out}\"\n"
            "[politeness]\nper_domain_concurrency = 2\n")


def test_a_job_created_by_the_api_is_crawled_and_controlled(
        redis_url, small_site, workers, tmp_path):
    settings = crawl_settings(redis_url)
    tracker = RedisTracker.from_url(redis_url)
    out = tmp_path / "out"
    procs = [workers(settings, f"api-{i}") for i in range(2)]
    # Each page takes 30 ms: the crawl lasts long enough to be paused while it runs.
    with SiteServer(small_site, delay=0.03) as site, \
            ApiServer(redis_url, env={"DISTSCRAPE_OUTPUT_ROOTS": str(tmp_path)}) as api:
        wait_for_workers(tracker, 2, procs=procs)
        missing = site.url("/no-such-page")
        status, made = api.request("PUT", "/api/jobs/site", _spec(site, out, missing),
                                   content_type="application/toml")
        assert status == 201 and made["created"] and made["dispatched"] > 0
        stream = EventStream(api, "/api/jobs/site/events?interval=0.2")
        assert stream.status == 200

        wait_until("pages done", lambda: tracker.stats("site").done >= 5, procs=procs)
        status, paused = api.request("POST", "/api/jobs/site/pause")
        assert status == 200 and (paused["before"], paused["after"]) == ("running", "paused")
        assert tracker.job_info("site").state is JobState.PAUSED
        # What was in flight ends; then nothing more is done while it is paused.
        wait_until("in-flight items end", lambda: _settled(tracker), procs=procs)
        held = tracker.stats("site")
        time.sleep(1.5)
        assert tracker.stats("site").done == held.done and held.frontier + held.dispatched > 0
        assert any(data["state"] == "paused" for _, data in list(stream.events))
        status, resumed = api.request("POST", "/api/jobs/site/resume")
        assert status == 200 and resumed["after"] == "running"

        assert stream.done.wait(120), "the stream did not end with the job"
        names = [name for name, _ in stream.events]
        assert names[-1] == "end" and set(names[:-1]) == {"status"}
        done = [data["done"] for _, data in stream.events]
        assert done == sorted(done) and done[0] < done[-1]
        last = stream.events[-1][1]
        assert last["state"] == "finished"
        assert last["done"] == len(small_site.reachable) and last["dead"] == 1
        assert saved_files(out) == expected_files(site, small_site, out)

        status, dead = api.request("GET", "/api/jobs/site/dead")
        assert status == 200 and dead["total"] == 1
        assert [d["item"] for d in dead["items"]] == [missing] and "404" in dead["items"][0]["reason"]
        status, domains = api.request("GET", "/api/jobs/site/domains")
        assert [(d["domain"], d["dead"]) for d in domains["domains"]] == [
            (site.base_url.split("//")[1], 1)]
        status, retried = api.request("POST", "/api/jobs/site/retry-dead")
        assert status == 200 and retried["requeued"] == 1
        assert tracker.job_info("site").state is JobState.RUNNING
        wait_until("the retried item dies again",
                   lambda: tracker.job_info("site").state is JobState.FINISHED, procs=procs)
        assert api.request("GET", "/api/jobs/site")[1]["dead"] == 1

        # A second job: refused deletion while it runs, cancelled, its stream ending, deleted.
        status, _ = api.request("PUT", "/api/jobs/other", _spec(site, tmp_path / "other"),
                                content_type="application/toml")
        assert status == 201
        other = EventStream(api, "/api/jobs/other/events?interval=0.2")
        status, refused = api.request("DELETE", "/api/jobs/other")
        assert status == 409 and "cancel it first" in refused["detail"]
        status, cancelled = api.request("POST", "/api/jobs/other/cancel")
        assert status == 200 and cancelled["after"] == "cancelled"
        assert tracker.job_info("other").state is JobState.CANCELLED
        assert other.done.wait(30) and other.events[-1][0] == "end"
        assert other.events[-1][1]["state"] == "cancelled"
        status, deleted = api.request("DELETE", "/api/jobs/other")
        assert status == 200 and deleted["keys"] > 0
        assert "other" not in tracker.jobs()
        assert api.request("GET", "/api/jobs/other")[0] == 404
        assert [row["job"] for row in api.request("GET", "/api/jobs")[1]] == ["site"]
        assert len(api.request("GET", "/api/workers")[1]) == 2


def _settled(tracker) -> bool:
    """True once nothing of the job is being fetched or saved (a paused job's dispatched
    messages wait, unfetched)."""
    stats = tracker.stats("site")
    return stats.leased == 0 and stats.save_pending == 0
