"""``distscrape api`` as a real process on a real Redis, no worker: its token, its limits, its
OpenAPI description, spec errors with their fields, schedules, and a job of 10,000 domains."""

from __future__ import annotations

import http.client
import subprocess
import sys
import time

import pytest
from openapi_spec_validator import validate

from distscrape_celery.tracker import JobState, RedisTracker
from tests.support.api import TOKEN, ApiServer, EventStream
from tests.support.ops import cli_env
from tests.support.sockets import listening


@pytest.fixture
def api(redis_url, tmp_path):
    with ApiServer(redis_url, "--max-body", "4096",
                   env={"DISTSCRAPE_OUTPUT_ROOTS": str(tmp_path)}) as server:
        yield server


def test_every_route_needs_the_token_and_no_url_carries_it(api):
    assert api.request("GET", "/api/jobs")[0] == 200
    for token in (None, "", "wrong-token-0123456789abcdef", TOKEN[:-1], TOKEN + "x"):
        status, body = api.request("GET", "/api/jobs", token=token)
        assert status == 401, token
    assert api.request("GET", f"/api/jobs?token={TOKEN}", token=None)[0] == 401
    assert api.request("GET", "/api/jobs", token=None,
                       headers={"Authorization": f"Basic {TOKEN}"})[0] == 401
    for method, path in [("PUT", "/api/jobs/j"), ("POST", "/api/jobs/j/pause"),
                         ("DELETE", "/api/jobs/j"), ("GET", "/api/schedules"),
                         ("GET", "/api/workers"), ("GET", "/api/jobs/j/dead")]:
        assert api.request(method, path, {"seeds": ["http://a.invalid/"]},
                           token="wrong-token-0123456789abcdef")[0] == 401, path
    stream = EventStream(api, "/api/events", token=None)
    assert stream.status == 401
    stream = EventStream(api, f"/api/events?token={TOKEN}", token=None)
    assert stream.status == 401
    # The dashboard's files hold no data: served without the token.
    status, page = api.request("GET", "/", token=None)
    assert status == 200 and b"<title>distscrape jobs</title>" in page


def test_it_listens_on_loopback_by_default(api):
    assert listening(api.proc.pid).addresses_on(api.port) == {"127.0.0.1"}


def test_it_refuses_to_start_without_a_good_token(redis_url, tmp_path):
    def start(*args, **env):
        return subprocess.run([sys.executable, "-m", "distscrape_celery.cli", "api", *args],
                              env=cli_env(redis_url, **env), capture_output=True, text=True,
                              timeout=60)

    res = start()
    assert res.returncode == 2 and "DISTSCRAPE_API_TOKEN" in res.stderr
    res = start(DISTSCRAPE_API_TOKEN="short-secret")
    assert res.returncode == 2 and "at least 16 characters" in res.stderr
    assert "short-secret" not in res.stderr
    weak = tmp_path / "weak"
    weak.write_text("tiny-secret\n")
    res = start("--token-file", str(weak))
    assert res.returncode == 2 and "at least 16" in res.stderr and "tiny-secret" not in res.stderr
    good = tmp_path / "token"
    good.write_text("from-a-file-0123456789\n")
    with ApiServer(redis_url, "--token-file", str(good), token=None) as server:
        assert server.request("GET", "/api/jobs", token="from-a-file-0123456789")[0] == 200
        assert server.request("GET", "/api/jobs", token=TOKEN)[0] == 401


def test_a_body_over_the_limit_is_refused_and_creates_nothing(api, tmp_path):
    spec = {"seeds": [f"http://h{i}.invalid/" for i in range(300)],
            "saver": {"output": str(tmp_path / "out")}}
    status, _ = api.request("PUT", "/api/jobs/big", spec)
    assert status == 413
    # Sent in chunks, with no Content-Length to refuse it by: refused once read past the limit.
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    conn.putrequest("PUT", "/api/jobs/big")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for _ in range(10):
        chunk = b" " * 1000
        conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    conn.send(b"0\r\n\r\n")
    assert conn.getresponse().status == 413
    conn.close()
    assert api.request("GET", "/api/jobs") == (200, [])


def test_the_openapi_description_is_served_and_valid(api):
    status, doc = api.request("GET", "/api/openapi.json", token=None)
    assert status == 200 and doc["openapi"] == "3.2.0"
    validate(doc)  # against the 3.2 schema, as the document says
    paths = doc["paths"]
    for path in ("/api/jobs", "/api/jobs/{job}", "/api/jobs/{job}/pause", "/api/jobs/{job}/resume",
                 "/api/jobs/{job}/cancel", "/api/jobs/{job}/dead", "/api/jobs/{job}/retry-dead",
                 "/api/jobs/{job}/events", "/api/jobs/{job}/domains", "/api/schedules",
                 "/api/schedules/{job}", "/api/events"):
        assert path in paths, path
    assert set(paths["/api/jobs/{job}"]) == {"get", "put", "delete"}
    put = paths["/api/jobs/{job}"]["put"]
    assert set(put["requestBody"]["content"]) == {"application/json", "application/toml"}
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert {"HTTPBearer": []} in paths["/api/jobs"]["get"]["security"]


def test_a_bad_spec_is_refused_with_its_field(api, tmp_path, redis_client):
    out = str(tmp_path / "out")
    cases = [
        (f'seeds = ["http://a.invalid/"]\n[scraper]\nlink_regex = "("\n[saver]\noutput = "{out}"\n',
         "application/toml", "scraper.link_regex", "invalid regular expression"),
        ({"seeds": ["http://a.invalid/"], "politeness": {"max_rate": -1}, "saver": {"output": out}},
         "application/json", "politeness.max_rate", "greater than 0"),
        ({"seeds": ["http://a.invalid/"], "nonsense": 1}, "application/json", "nonsense",
         "Extra inputs"),
        ({"saver": {"output": out}}, "application/json", "seeds", "at least one seed"),
        ('seeds = ["http://a.invalid/"', "application/toml", "(body)", "does not parse"),
        ("[1, 2]", "application/json", "(body)", "not an object"),
    ]
    for body, ctype, field, message in cases:
        status, answer = api.request("PUT", "/api/jobs/bad", body, content_type=ctype)
        assert status == 422, (field, answer)
        fields = {p["field"]: p["msg"] for p in answer["detail"]}
        assert field in fields and message in fields[field], (field, answer)
    # An output outside the API's DISTSCRAPE_OUTPUT_ROOTS, as a worker would refuse it.
    status, answer = api.request("PUT", "/api/jobs/bad", {"seeds": ["http://a.invalid/"],
                                                         "saver": {"output": "/etc/x"}})
    assert status == 422 and "saver.output" in answer["detail"][0]["msg"]
    assert api.request("PUT", "/api/jobs/bad", "x", content_type="text/plain")[0] == 422
    assert redis_client.keys("ds:{bad}*") == []
    assert api.request("GET", "/api/jobs/bad")[0] == 404


def test_jobs_schedules_and_seeds_without_workers(api, tmp_path, redis_url):
    out = str(tmp_path / "out")
    toml = f'seeds = ["http://a.invalid/"]\n[saver]\noutput = "{out}"\n[schedule]\nevery = "6h"\n'
    status, made = api.request("PUT", "/api/jobs/j", toml, content_type="application/toml")
    assert status == 201 and made["created"] and made["added"] == 1
    assert made["schedule"] == "every 6h" and made["next_due"] > time.time() + 5 * 3600
    # The same spec again: its seeds are taken (200), a different one is a conflict (409).
    status, again = api.request("PUT", "/api/jobs/j", toml, content_type="application/toml")
    assert status == 200 and not again["created"] and again["already_seen"] == 1
    status, answer = api.request("PUT", "/api/jobs/j", {"seeds": ["http://a.invalid/"],
                                                       "saver": {"output": out + "2"}})
    assert status == 409 and "saver.output" in answer["detail"]
    status, more = api.request("POST", "/api/jobs/j/seeds",
                               {"seeds": ["http://a.invalid/x", "http://b.invalid/"]})
    assert status == 200 and more["added"] == 2 and more["off_host"] == 1
    status, row = api.request("GET", "/api/jobs/j")
    assert status == 200 and row["seen"] == 3 and row["state"] == "running"
    assert api.request("GET", "/api/jobs/j/spec")[1]["saver"]["output"] == out

    assert [r["job"] for r in api.request("GET", "/api/schedules")[1]] == ["j"]
    assert api.request("POST", "/api/schedules/j/pause")[1]["paused"] is True
    tracker = RedisTracker.from_url(redis_url)
    assert tracker.job_info("j").schedule_paused
    assert api.request("POST", "/api/schedules/j/resume")[1]["paused"] is False
    status, row = api.request("PUT", "/api/schedules/j", {"cron": "0 3 * * *"})
    assert status == 200 and row["schedule"] == "cron '0 3 * * *'" or row["schedule"].startswith("cron")
    assert api.request("PUT", "/api/schedules/j", {"every": "soon"})[0] == 422
    assert api.request("PUT", "/api/schedules/j", {"every": "1h", "cron": "* * * * *"})[0] == 422
    assert api.request("PUT", "/api/schedules/nope", {"every": "1h"})[0] == 404
    assert api.request("DELETE", "/api/schedules/j")[0] == 200
    assert tracker.job_info("j").schedule is None
    assert api.request("DELETE", "/api/schedules/j")[0] == 422  # it has none
    assert api.request("GET", "/api/schedules")[1] == []

    # A running job is deleted only with force; a job that does not exist is a 404.
    assert api.request("DELETE", "/api/jobs/j")[0] == 409
    assert api.request("POST", "/api/jobs/nope/pause")[0] == 404
    assert api.request("POST", "/api/jobs/j/run")[0] == 409
    status, gone = api.request("DELETE", "/api/jobs/j?force=true")
    assert status == 200 and gone["keys"] > 0
    assert api.request("GET", "/api/jobs/j")[0] == 404


def test_a_job_of_ten_thousand_domains_pages_its_domain_table(api, tmp_path, redis_url):
    seeds = [f"http://d{i:05d}.invalid/" for i in range(10_000)]
    with ApiServer(redis_url, env={"DISTSCRAPE_OUTPUT_ROOTS": str(tmp_path)}) as big:
        status, made = big.request("PUT", "/api/jobs/wide", {
            "seeds": seeds, "scraper": {"same_host": False},
            "saver": {"output": str(tmp_path / "out")}})
        assert status == 201 and made["added"] == 10_000
        assert big.request("POST", "/api/jobs/wide/pause")[1]["after"] == "paused"
        started = time.monotonic()
        status, page = big.request("GET", "/api/jobs/wide/domains?limit=100&sort=domain")
        took = time.monotonic() - started
        assert status == 200 and page["total"] == 10_000 and len(page["domains"]) == 100
        assert [d["domain"] for d in page["domains"]] == [f"d{i:05d}.invalid" for i in range(100)]
        assert all(d["queued"] + d["in_flight"] == 1 for d in page["domains"])
        assert took < 5, f"the domain table of 10,000 domains took {took:.1f}s"
        status, page = big.request("GET", "/api/jobs/wide/domains?q=d0999&sort=domain")
        assert page["total"] == 10 and page["domains"][0]["domain"] == "d09990.invalid"
        status, last = big.request("GET", "/api/jobs/wide/domains?offset=9950&limit=100&sort=domain")
        assert len(last["domains"]) == 50
        assert RedisTracker.from_url(redis_url).job_info("wide").state is JobState.PAUSED
