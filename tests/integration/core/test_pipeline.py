"""The item pipeline against a real Redis tracker and real HTTP, without Celery in the way."""

from __future__ import annotations

import pytest

from tests.support.pipeline import ROUTES, full_disk_save, lease_runs_out, pipeline_env
from tests.support.tracker_state import item_state

from distscrape_celery.tracker.keys import JobKeys


@pytest.fixture
def env(redis_url, server, tmp_path):
    return pipeline_env(redis_url, server, tmp_path)


def test_scrape_then_save_completes_and_queues_links(env, tmp_path):
    rt, pipe, rec, server = env
    rt.tracker.add("p", [server.base + "/ok"])
    assert pipe.scrape("p", server.base + "/ok") == "scraped"
    assert rt.tracker.stats("p").done == 0  # not done before it is saved
    assert rec.scrapes == [server.base + "/ok2"]  # dispatched at once; the off-site link dropped
    (job, item, token, meta) = rec.saves[0]
    assert rt.staging.get(job, token) == ROUTES["/ok"][1]
    assert pipe.save(job, item, token, meta) == "saved"
    assert rt.staging.get(job, token) is None  # dropped once the item is done
    assert rt.tracker.stats("p").done == 1
    saved = list((tmp_path / "out").rglob("*.html"))
    assert [p.read_bytes() for p in saved] == [ROUTES["/ok"][1]]


def test_a_save_reads_its_body_with_begin_save_not_on_its_own(env, tmp_path, monkeypatch):
    """The staged body comes back with begin_save, one Redis round trip fewer per page."""
    rt, pipe, rec, server = env
    rt.tracker.add("p", [server.base + "/ok"])
    assert pipe.scrape("p", server.base + "/ok") == "scraped"
    reads = []
    real_get = rt.staging.get
    monkeypatch.setattr(rt.staging, "get", lambda *a: (reads.append(a), real_get(*a))[1])
    assert pipe.save(*rec.saves[0]) == "saved"
    assert reads == []
    assert [p.read_bytes() for p in (tmp_path / "out").rglob("*.html")] == [ROUTES["/ok"][1]]


def test_redelivered_duplicate_of_a_done_item_does_nothing(env):
    rt, pipe, rec, server = env
    url = server.base + "/ok2"
    rt.tracker.add("p", [url])
    pipe.scrape("p", url)
    pipe.save(*rec.saves[0])
    hits = len(server.page_hits)
    assert pipe.scrape("p", url) == "done"
    assert len(server.page_hits) == hits  # no second download
    assert len(rec.saves) == 1


def test_item_leased_elsewhere_is_not_fetched(env):
    rt, pipe, rec, server = env
    url = server.base + "/ok2"
    rt.tracker.add("p", [url])
    rt.tracker.checkout("p", url, "another-worker", max_lost=1)
    assert pipe.scrape("p", url) == "busy"
    assert server.page_hits == []


def test_http_404_is_dead_at_once_and_503_after_retries(env):
    rt, pipe, rec, server = env
    rt.tracker.add("p", [server.base + "/gone", server.base + "/flaky"])
    assert pipe.scrape("p", server.base + "/gone") == "dead"
    assert pipe.scrape("p", server.base + "/flaky") == "retry"
    # It waits out its backoff in the tracker: a message for it meanwhile fetches nothing.
    assert rt.tracker.stats("p").delayed == 1
    hits = len(server.hits)
    assert pipe.scrape("p", server.base + "/flaky") == "busy"
    assert len(server.hits) == hits
    rt.tracker.client.zadd(JobKeys("p").delayed, {server.base + "/flaky": 0}, xx=True)  # due now
    assert rt.tracker.maintain("p", max_lost=10).dispatch == [server.base + "/flaky"]
    assert pipe.scrape("p", server.base + "/flaky") == "dead"  # max_retries=1
    dead = rt.tracker.dead_items("p")
    assert "404" in dead[server.base + "/gone"] and "503" in dead[server.base + "/flaky"]
    s = rt.tracker.stats("p")
    assert (s.done, s.dead, s.finished) == (0, 2, True)


def test_hostile_page_is_saved_and_worker_carries_on(env):
    rt, pipe, rec, server = env
    url = server.base + "/hostile"
    rt.tracker.add("p", [url])
    assert pipe.scrape("p", url) == "scraped"
    assert server.base + "/ok2" in rec.scrapes
    assert pipe.save(*rec.saves[0]) == "saved"


def test_missing_staged_body_counts_as_lost_not_as_the_items_fault(env):
    rt, pipe, rec, server = env
    url = server.base + "/ok2"
    rt.tracker.add("p", [url])
    pipe.scrape("p", url)
    job, item, token, meta = rec.saves[0]
    rt.staging.discard(job, token)  # as if its TTL ran out
    assert pipe.save(job, item, token, meta) == "retry"
    co = rt.tracker.checkout("p", url, "w", max_lost=1)
    assert co.status.value == "ok" and co.failed_attempts == 0
    assert rt.tracker.checkout("p", url, "w", max_lost=1).status.value == "busy"


def test_redelivered_save_after_its_process_died_counts_and_ends_dead(env, tmp_path):
    """Hole: the save task took (GETDEL) the body, its process was SIGKILLed, the redelivered
    save found no body and re-queued the item without counting: a page whose save always
    crashes was fetched forever. Now the body stays until the item is done, and every
    interrupted save run counts against max_lost."""
    rt, pipe, rec, server = env
    url = server.base + "/ok2"
    rt.tracker.add("p", [url])
    assert pipe.scrape("p", url) == "scraped"
    job, item, token, meta = rec.saves[0]
    max_lost = rt.spec("p").max_lost

    class Killed(BaseException):
        """Stands for SIGKILL: nothing after it runs, not even except-Exception handlers."""

    def crash(*args):
        raise Killed

    saver = rt.saver("p")
    real_save = saver.save
    saver.save = crash
    for _ in range(max_lost + 1):  # each redelivery of the same message
        with pytest.raises(Killed):
            pipe.save(job, item, token, meta)
        lease_runs_out(rt, job, item)
    assert pipe.save(job, item, token, meta) == "save-skipped-dead"
    assert "interrupted" in rt.tracker.dead_items("p")[url]
    assert len(server.page_hits) == 1  # downloaded once; never looped back to a fetch
    s = rt.tracker.stats("p")
    assert (s.done, s.dead, s.finished) == (0, 1, True)
    saver.save = real_save


def test_redelivered_save_after_one_crash_still_saves(env, tmp_path):
    rt, pipe, rec, server = env
    url = server.base + "/ok2"
    rt.tracker.add("p", [url])
    pipe.scrape("p", url)
    job, item, token, meta = rec.saves[0]
    rt.tracker.begin_save(job, item, token, rt.worker_id, max_lost=5)  # ... then the process died
    lease_runs_out(rt, job, item)
    assert pipe.save(job, item, token, meta) == "saved"
    assert len(server.page_hits) == 1
    assert rt.tracker.stats("p").done == 1


def test_duplicate_save_while_the_first_runs_comes_back_later(env):
    rt, pipe, rec, server = env
    url = server.base + "/ok2"
    rt.tracker.add("p", [url])
    pipe.scrape("p", url)
    job, item, token, meta = rec.saves[0]
    rt.tracker.begin_save(job, item, token, "first-run", max_lost=0)  # ... still saving
    assert pipe.save(job, item, token, meta) == "save-busy"
    assert rec.saves[-1] == (job, item, token, meta) and rec.delays[-1] > 0  # sent again, later
    assert rt.tracker.stats("p").dead == 0


def test_full_output_defers_the_save_without_counting(env, tmp_path, monkeypatch):
    rt, pipe, rec, server = env
    url = server.base + "/ok2"
    rt.tracker.add("p", [url])
    pipe.scrape("p", url)
    saver = rt.saver("p")
    real_save = saver.save
    monkeypatch.setattr(saver, "save", full_disk_save)
    for n in range(1, 6):  # far more than max_retries=1
        assert pipe.save(*rec.saves[-1]) == "deferred"
        assert len(rec.saves) == n + 1 and rec.delays[-1] > 0  # the save is sent again, later
    s = rt.tracker.stats("p")
    assert (s.done, s.dead, s.save_pending) == (0, 0, 1)
    monkeypatch.setattr(saver, "save", real_save)  # space came back
    assert pipe.save(*rec.saves[-1]) == "saved"
    assert len(server.page_hits) == 1  # the body was kept: no second download
    assert rt.tracker.stats("p").done == 1


def test_stale_scrape_leaves_the_item_to_its_new_holder(env):
    rt, pipe, rec, server = env
    url = server.base + "/ok"
    rt.tracker.add("p", [url])
    real_checkout = rt.tracker.checkout

    def checkout_then_lose_it(job, item, worker, **kw):
        co = real_checkout(job, item, worker, **kw)
        rt.tracker.release(job, worker)  # our lease is gone before the download ends ...
        real_checkout(job, item, "other-worker", **kw)  # ... and someone else holds it now
        return co

    rt.tracker.checkout = checkout_then_lose_it
    assert pipe.scrape("p", url) == "stale"
    assert rec.saves == []  # no save from a stale holder
    assert server.base + "/ok2" in rec.scrapes  # but what it found is queued
    s = rt.tracker.stats("p")
    assert (s.leased, s.dead) == (1, 0)


def test_failing_saver_never_marks_done(env, tmp_path):
    rt, pipe, rec, server = env
    url = server.base + "/ok2"
    rt.tracker.add("p", [url])
    (tmp_path / "out").write_text("a file where the output directory should be")
    for expected in ("retry", "dead"):
        assert pipe.scrape("p", url) == "scraped"
        assert pipe.save(*rec.saves[-1]) == expected
    s = rt.tracker.stats("p")
    assert (s.done, s.dead) == (0, 1)
    assert "save failed" in rt.tracker.dead_items("p")[url]


def test_scraper_bug_fails_the_item_not_the_worker(env, monkeypatch):
    rt, pipe, rec, server = env
    url = server.base + "/ok"
    rt.tracker.add("p", [url])

    def broken(item, download):
        raise RuntimeError("parser exploded")

    monkeypatch.setattr(rt.scraper("p"), "find_items", broken)
    assert pipe.scrape("p", url) == "retry"
    assert rec.saves == []


@pytest.fixture
def inline_env(redis_url, server, tmp_path):
    return pipeline_env(redis_url, server, tmp_path, save_inline=True)


def test_save_inline_saves_in_the_scrape_and_queues_no_save(inline_env, tmp_path):
    """With ``save_inline`` the scrape task saves its page itself; no save message."""
    rt, pipe, rec, server = inline_env
    rt.tracker.add("p", [server.base + "/ok"])
    assert pipe.scrape("p", server.base + "/ok") == "saved"
    assert rec.saves == []
    assert rec.scrapes == [server.base + "/ok2"]  # what it links to is still queued
    assert rt.tracker.stats("p").done == 1
    assert list(rt.tracker.client.scan_iter(JobKeys("p").prefix + "body:*")) == []
    saved = list((tmp_path / "out").rglob("*.html"))
    assert [p.read_bytes() for p in saved] == [ROUTES["/ok"][1]]


def test_save_inline_stages_no_body_and_needs_no_begin_save(inline_env, monkeypatch):
    """The body of an inline save never goes through Redis, and the item turns saving in
    the ``scraped`` step: three tracker calls a page, not four."""
    rt, pipe, rec, server = inline_env
    rt.tracker.add("p", [server.base + "/ok"])
    bodies_at_save = []
    saver = rt.saver("p")
    real_save = saver.save

    def look(item, download):
        bodies_at_save.append(list(rt.tracker.client.scan_iter(JobKeys("p").prefix + "body:*")))
        assert item_state(rt.tracker.client, "p", item).startswith("S")  # saving
        return real_save(item, download)

    def no_begin_save(*args, **kwargs):
        raise AssertionError("begin_save called by an inline save")

    monkeypatch.setattr(saver, "save", look)
    monkeypatch.setattr(rt.tracker, "begin_save", no_begin_save)
    assert pipe.scrape("p", server.base + "/ok") == "saved"
    assert bodies_at_save == [[]]
    assert rt.tracker.stats("p").done == 1


def test_save_inline_on_a_full_output_stages_the_body_for_a_later_save(inline_env, monkeypatch):
    """A full disk must not cost an inline save's page a second download: its body is staged
    then, and the deferred save task finds it."""
    rt, pipe, rec, server = inline_env
    url = server.base + "/ok2"
    rt.tracker.add("p", [url])
    saver = rt.saver("p")
    real_save = saver.save
    monkeypatch.setattr(saver, "save", full_disk_save)
    assert pipe.scrape("p", url) == "deferred"
    assert len(rec.saves) == 1 and rec.delays[-1] > 0
    monkeypatch.setattr(saver, "save", real_save)  # space came back
    assert pipe.save(*rec.saves[-1]) == "saved"
    assert len(server.page_hits) == 1  # no second download
    assert rt.tracker.stats("p").done == 1
    assert list(rt.tracker.client.scan_iter(JobKeys("p").prefix + "body:*")) == []


def test_save_inline_failure_fails_the_item_as_a_save_task_would(inline_env, monkeypatch):
    rt, pipe, rec, server = inline_env
    rt.tracker.add("p", [server.base + "/ok"])

    def broken(item, download):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(rt.saver("p"), "save", broken)
    assert pipe.scrape("p", server.base + "/ok") == "retry"
    assert rec.saves == []
    stats = rt.tracker.stats("p")
    assert stats.done == 0 and stats.dead == 0
    assert pipe.scrape("p", server.base + "/ok") == "dead"  # max_retries = 1
    assert "save failed: disk on fire" in rt.tracker.dead_items("p")[server.base + "/ok"]


def test_save_inline_in_batches_saves_the_group_here_with_one_complete(
    redis_url, server, tmp_path, monkeypatch
):
    """With ``save_inline`` and save batches, the pages a process scraped wait in it, each
    saving under its lease with no body staged, and are saved there as one group: no save task,
    no begin_saves, no hand-over, one complete_many."""
    rt, pipe, rec, server = pipeline_env(redis_url, server, tmp_path, save_inline=True,
                                         save_batch_size=8, save_batch_seconds=5)
    pages = [server.base + "/ok", server.base + "/ok2", server.base + "/hostile"]
    rt.tracker.add("p", pages)
    calls = []
    for name in ("complete_many", "complete", "begin_saves", "begin_save", "handoff"):
        real = getattr(rt.tracker, name)
        monkeypatch.setattr(rt.tracker, name,
                            lambda *a, _real=real, _name=name, **kw: (calls.append(_name),
                                                                      _real(*a, **kw))[1])
    assert [pipe.scrape("p", url) for url in pages] == ["scraped"] * 3
    assert [item_state(rt.tracker.client, "p", url)[0] for url in pages] == ["S"] * 3
    assert list(rt.tracker.client.scan_iter(JobKeys("p").prefix + "body:*")) == []
    assert rt.tracker.stats("p").done == 0 and not list((tmp_path / "out").rglob("*.html"))
    assert pipe.flush(timeout=10)
    assert calls == ["complete_many"]
    assert rec.saves == []
    assert rt.tracker.stats("p").done == 3
    saved = sorted(p.read_bytes() for p in (tmp_path / "out").rglob("*.html"))
    assert saved == sorted(ROUTES[url.removeprefix(server.base)][1] for url in pages)


def test_save_inline_in_batches_fails_only_the_page_whose_save_failed(
    redis_url, server, tmp_path, monkeypatch
):
    """A save of the group that raised counts against its own page; the others are done."""
    rt, pipe, rec, server = pipeline_env(redis_url, server, tmp_path, save_inline=True,
                                         save_batch_size=8, save_batch_seconds=5)
    good, bad = server.base + "/ok", server.base + "/ok2"
    rt.tracker.add("p", [good, bad])
    saver = rt.saver("p")
    real_save_many = saver.save_many

    def one_fails(entries):
        out = real_save_many([e for e in entries if e[0] != bad])
        return [RuntimeError("disk on fire") if item == bad else out.pop(0) for item, _ in entries]

    monkeypatch.setattr(saver, "save_many", one_fails)
    assert [pipe.scrape("p", url) for url in (good, bad)] == ["scraped", "scraped"]
    assert pipe.flush(timeout=10)
    stats = rt.tracker.stats("p")
    assert (stats.done, stats.dead, stats.leased) == (1, 0, 0)
    assert item_state(rt.tracker.client, "p", bad)[0] in "qwd"  # back for another attempt
    assert [p.read_bytes() for p in (tmp_path / "out").rglob("*.html")] == [ROUTES["/ok"][1]]


@pytest.mark.parametrize("batched", [False, True], ids=["save", "save_batch"])
def test_a_process_that_only_saves_follows_a_job_seeded_again(env, tmp_path, batched):
    """A process that runs save tasks and no scrape task built the first job's saver. Once the
    job is deleted and seeded again with another output, its saves of the new job's pages go to
    the new output: begin_save tells it the job is another creation."""
    from distscrape_celery.core.pipeline import ItemPipeline
    from distscrape_celery.core.runtime import Runtime
    from distscrape_celery.job.spec import build_spec
    from tests.support.pipeline import Recorder

    rt, pipe, rec, server = env
    saving = ItemPipeline(Runtime.for_redis(rt.settings), Recorder())  # another process's caches

    def save(job, item, token, meta):
        if batched:
            return saving.save_batch(job, [(item, token, meta)])[0]
        return saving.save(job, item, token, meta)

    rt.tracker.add("p", [server.base + "/ok"])
    assert pipe.scrape("p", server.base + "/ok") == "scraped"
    assert save(*rec.saves.pop()) == "saved"
    assert len(list((tmp_path / "out").rglob("*.html"))) == 1

    rt.tracker.delete_job("p")
    spec = build_spec({"seeds": [server.base + "/ok2"], "saver": {"output": str(tmp_path / "new")}})
    rt.tracker.create_job("p", spec.to_json(), spec.crawl_limits())
    rt.tracker.add("p", [server.base + "/ok2"])
    assert pipe.scrape("p", server.base + "/ok2") == "scraped"
    assert save(*rec.saves.pop()) == "saved"
    assert [p.read_bytes() for p in (tmp_path / "new").rglob("*.html")] == [ROUTES["/ok2"][1]]
    assert len(list((tmp_path / "out").rglob("*.html"))) == 1
