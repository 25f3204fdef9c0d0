"""Fetcher against real HTTP servers on 127.0.0.1 that each test sets up for itself."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest

from distscrape_celery.errors import FetchError
from distscrape_celery.web.fetch import Download, Fetcher, conditional
from distscrape_celery.job.sections import FetchSpec
from tests.support.http import Route, nested_gzip_bomb, reply, serve
from tests.support.ops import closed_port as _closed_port
from tests.support import REPO_ROOT


def fetcher(**limits: object) -> Fetcher:
    base = dict(connect_timeout=2, read_timeout=2, total_timeout=5, user_agent="test-agent/1.0")
    base.update(limits)
    return Fetcher(FetchSpec(**base))


def fetch_error(fetch: Fetcher, url: str) -> FetchError:
    with pytest.raises(FetchError) as info:
        fetch.get(url)
    return info.value


def test_ok_download_reports_status_type_body_and_sends_user_agent() -> None:
    page = b"<html><body>hello</body></html>"
    headers = {"Content-Type": "text/html; charset=utf-8"}
    routes = {"/page?q=1": lambda h: reply(h, 200, page, headers)}
    before = time.time()
    with serve(routes) as (base, _, log):
        got = fetcher().get(base + "/page?q=1")
    assert got == Download(
        url=base + "/page?q=1", status=200, content_type="text/html; charset=utf-8", body=page,
        fetched_at=got.fetched_at,
    )
    assert before <= got.fetched_at <= time.time()
    assert Download.from_meta(got.meta(), page) == got
    assert log[0]["headers"]["User-Agent"] == "test-agent/1.0"


def test_missing_content_type_is_empty_string() -> None:
    with serve({"/raw": lambda h: reply(h, 200, b"\x00\x01")}) as (base, _, _log):
        got = fetcher().get(base + "/raw")
    assert (got.content_type, got.body) == ("", b"\x00\x01")


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(400, False), (403, False), (404, False), (410, False),
     (408, True), (429, True), (500, True), (502, True), (503, True)],
)
def test_http_error_status_maps_to_retryable_or_not(status: int, retryable: bool) -> None:
    with serve({"/x": lambda h: reply(h, status, b"error page")}) as (base, _, _log):
        error = fetch_error(fetcher(), base + "/x")
    assert error.retryable is retryable
    assert str(error) == f"HTTP {status} for {base}/x"


def test_a_304_to_a_request_that_asked_nothing_conditionally_is_a_retryable_error() -> None:
    """304 answers a conditional request ("the copy you have is current"); to a request that
    named no copy it holds no page, and saving its empty body would replace a page with
    nothing. A cache that serves it may stop: retryable. Asked conditionally, it is a 304."""
    routes = {"/page": lambda h: reply(h, 304, headers={"ETag": '"v1"'})}
    with serve(routes) as (base, _, log):
        error = fetch_error(fetcher(), base + "/page")
        with conditional('"v1"'):
            got = fetcher().get(base + "/page")
    assert error.retryable is True and error.status == 304
    assert str(error) == (f"HTTP 304 (not modified) to a request that asked nothing "
                          f"conditionally: {base}/page")
    assert got.not_modified and got.body == b"" and got.etag == '"v1"'
    assert "If-None-Match" not in log[0]["headers"] and log[1]["headers"]["If-None-Match"] == '"v1"'


def test_body_over_max_bytes_is_not_retryable() -> None:
    with serve({"/big": lambda h: reply(h, 200, b"x" * 5000)}) as (base, _, _log):
        error = fetch_error(fetcher(max_bytes=1000), base + "/big")
    assert error.retryable is False
    assert "max_bytes=1000" in str(error)


def test_body_exactly_max_bytes_is_kept() -> None:
    with serve({"/fits": lambda h: reply(h, 200, b"y" * 1000)}) as (base, _, _log):
        assert fetcher(max_bytes=1000).get(base + "/fits").body == b"y" * 1000


def test_max_bytes_counts_decoded_bytes_of_a_compressed_body() -> None:
    bomb = gzip.compress(b"\0" * 1_000_000)
    assert len(bomb) < 10_000
    routes = {"/bomb": lambda h: reply(h, 200, bomb, {"Content-Encoding": "gzip"})}
    with serve(routes) as (base, _, _log):
        error = fetch_error(fetcher(max_bytes=100_000), base + "/bomb")
    assert error.retryable is False
    assert "max_bytes=100000" in str(error)


def test_gzip_body_is_decoded() -> None:
    text = b"<html>" + b"compressible " * 1000 + b"</html>"
    headers = {"Content-Encoding": "gzip", "Content-Type": "text/html"}
    with serve({"/gz": lambda h: reply(h, 200, gzip.compress(text), headers)}) as (base, _, _log):
        got = fetcher().get(base + "/gz")
    assert got.body == text


def test_body_not_matching_its_content_encoding_is_not_retryable() -> None:
    routes = {"/lie": lambda h: reply(h, 200, b"this is not gzip", {"Content-Encoding": "gzip"})}
    with serve(routes) as (base, _, _log):
        error = fetch_error(fetcher(), base + "/lie")
    assert error.retryable is False
    assert str(error) == f"cannot decode the body of {base}/lie"


def test_server_stalling_before_headers_is_a_retryable_timeout() -> None:
    def stall(handler: BaseHTTPRequestHandler) -> None:
        release.wait(10)

    with serve({"/slow": stall}) as (base, release, _log):
        started = time.monotonic()
        error = fetch_error(fetcher(read_timeout=0.5), base + "/slow")
        elapsed = time.monotonic() - started
    assert error.retryable is True
    assert str(error) == f"timed out after 0.5s reading {base}/slow"
    assert elapsed < 2


def test_server_stalling_mid_body_is_a_retryable_timeout() -> None:
    def half(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        handler.wfile.write(b"x" * 10)
        handler.wfile.flush()
        release.wait(10)

    with serve({"/half": half}) as (base, release, _log):
        error = fetch_error(fetcher(read_timeout=0.5), base + "/half")
    assert error.retryable is True
    assert str(error) == f"timed out after 0.5s reading {base}/half"


def test_slow_drip_hits_total_timeout() -> None:
    # Every byte arrives well within read_timeout; only the total deadline can stop this.
    def drip(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        for _ in range(100):
            handler.wfile.write(b"x")
            handler.wfile.flush()
            if release.wait(0.05):
                return

    with serve({"/drip": drip}) as (base, release, _log):
        started = time.monotonic()
        error = fetch_error(fetcher(read_timeout=1, total_timeout=0.5), base + "/drip")
        elapsed = time.monotonic() - started
    assert error.retryable is True
    assert "total_timeout" in str(error)
    assert 0.5 <= elapsed < 1.5


def test_truncated_body_is_retryable() -> None:
    def truncated(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        handler.wfile.write(b"x" * 10)
        handler.close_connection = True

    with serve({"/cut": truncated}) as (base, _, _log):
        error = fetch_error(fetcher(), base + "/cut")
    assert error.retryable is True
    assert str(error) == f"connection broken while reading {base}/cut"


def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port now.
    error = fetch_error(fetcher(), f"http://127.0.0.1:{port}/")
    assert error.retryable is True
    assert str(error) == f"connection refused for http://127.0.0.1:{port}/"


def test_redirects_are_followed_and_final_url_reported() -> None:
    routes = {
        "/a": lambda h: reply(h, 301, headers={"Location": "/b"}),
        "/b": lambda h: reply(h, 302, headers={"Location": "/final?x=1"}),
        "/final?x=1": lambda h: reply(h, 200, b"done", {"Content-Type": "text/plain"}),
    }
    with serve(routes) as (base, _, log):
        got = fetcher(max_redirects=2).get(base + "/a")
    assert (got.url, got.status, got.body) == (base + "/final?x=1", 200, b"done")
    assert [entry["path"] for entry in log] == ["/a", "/b", "/final?x=1"]


def test_too_many_redirects_is_not_retryable() -> None:
    routes = {
        "/a": lambda h: reply(h, 302, headers={"Location": "/b"}),
        "/b": lambda h: reply(h, 302, headers={"Location": "/c"}),
        "/c": lambda h: reply(h, 200, b"too far"),
    }
    with serve(routes) as (base, _, log):
        error = fetch_error(fetcher(max_redirects=1), base + "/a")
    assert error.retryable is False
    assert str(error) == f"more than 1 redirects from {base}/a"
    assert "/c" not in [entry["path"] for entry in log]


def test_redirect_to_another_scheme_is_not_retryable() -> None:
    routes = {"/a": lambda h: reply(h, 302, headers={"Location": "ftp://files.invalid/x"})}
    with serve(routes) as (base, _, _log):
        error = fetch_error(fetcher(), base + "/a")
    assert error.retryable is False
    assert str(error).startswith(f"invalid URL {base}/a")


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "file:///etc/passwd", "127.0.0.1/x", ""])
def test_non_http_url_is_refused_without_traffic(url: str) -> None:
    error = fetch_error(fetcher(), url)
    assert error.retryable is False
    assert str(error) == f"not an http(s) URL: {url}"


@pytest.mark.parametrize(
    "url",
    ["http://", "http://[::1/", "http://a b.invalid/", "http://x..invalid/",
     "http://h.invalid:99999/"],
)
def test_malformed_url_is_not_retryable(url: str) -> None:
    error = fetch_error(fetcher(), url)
    assert error.retryable is False
    assert str(error).startswith(f"invalid URL {url}")


def test_threads_share_a_hosts_kept_alive_connections() -> None:
    routes = {"/k": lambda h: reply(h, 200, b"keep-alive")}
    fetch = fetcher()
    with serve(routes) as (base, _, log):
        fetch.get(base + "/k")
        fetch.get(base + "/k")
        other = threading.Thread(target=fetch.get, args=(base + "/k",))
        other.start()
        other.join(5)
    ports = [entry["port"] for entry in log]
    assert len(ports) == 3
    # One connection, whichever thread asks: a pool per host, not per thread.
    assert len(set(ports)) == 1


def _together(n: int) -> Route:
    """A route that answers once ``n`` requests are in at once (each on its own connection)."""
    barrier = threading.Barrier(n, timeout=5)

    def route(handler: BaseHTTPRequestHandler) -> None:
        barrier.wait()
        reply(handler, 200, b"together")

    return route


def _at_once(fetch: Fetcher, url: str, n: int) -> None:
    threads = [threading.Thread(target=fetch.get, args=(url,)) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)


@pytest.mark.parametrize("per_host, kept", [(8, 3), (2, 2)])
def test_a_host_keeps_the_connections_in_flight_up_to_connections_per_host(
        per_host: int, kept: int) -> None:
    """Three requests at once open three connections; afterwards the pool keeps those it may
    (``connections_per_host``) and the next requests reuse them, opening none."""
    routes = {"/t": _together(3), "/k": lambda h: reply(h, 200, b"k")}
    fetch = Fetcher(FetchSpec(connect_timeout=2, read_timeout=6, total_timeout=8),
                    connections_per_host=per_host)
    with serve(routes) as (base, _, log):
        _at_once(fetch, base + "/t", 3)
        opened = {e["port"] for e in log}
        assert len(opened) == 3 and [e["path"] for e in log] == ["/t"] * 3
        _at_once(fetch, base + "/k", 3)
        for _ in range(3):
            fetch.get(base + "/k")
    later = {e["port"] for e in log[3:]}
    assert len(log) == 9
    # At most `kept` of the first connections serve again; three at once need one more when
    # only two were kept.
    assert len(later & opened) == kept
    assert len(later - opened) == 3 - kept


def test_for_job_keeps_as_many_connections_a_host_as_the_job_allows_in_flight() -> None:
    from distscrape_celery.job.spec import JobSpec

    spec = JobSpec.model_validate({"seeds": ["http://127.0.0.1/"],
                                   "politeness": {"per_domain_concurrency": 3}})
    assert Fetcher.for_job(spec).connections_per_host == 3
    spec = JobSpec.model_validate({"seeds": ["http://127.0.0.1/"], "politeness": {
        "domain_overrides": {"a.invalid": {"concurrency": 20}}}})
    assert Fetcher.for_job(spec).connections_per_host == 20


def test_a_forked_child_opens_its_own_connections() -> None:
    """A child process never writes to a connection its parent kept alive (both would read the
    answers of one socket)."""
    import os

    routes = {"/k": lambda h: reply(h, 200, b"k")}
    fetch = fetcher()
    with serve(routes) as (base, _, log):
        fetch.get(base + "/k")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one request, its status through the pipe, and out
            code = 1
            try:
                os.write(write, str(fetch.get(base + "/k").status).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        answer = os.read(read, 16)
        os.close(read)
        fetch.get(base + "/k")
    assert status == 0 and answer == b"200"
    ports = [e["port"] for e in log]
    assert len(ports) == 3
    assert ports[1] != ports[0] and ports[2] == ports[0]


def test_proxy_and_netrc_from_the_environment_are_not_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    # A crawl must not route through a user's proxy or send their .netrc credentials to sites.
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login user password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # the discard port: refused
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    routes = {"/p": lambda h: reply(h, 200, b"direct")}
    with serve(routes) as (base, _, log):
        assert fetcher().get(base + "/p").body == b"direct"
    assert log[0]["headers"].get("Authorization") is None


@pytest.mark.parametrize("url", ["http://x..invalid/", "http://.x.invalid/", "http://u@.x.invalid/p",
                                 "http://u:p@x..invalid:80/", "https://..invalid/"])
def test_a_host_with_an_empty_label_is_named_as_such(url: str) -> None:
    from distscrape_celery.web.fetch import _check_host

    with pytest.raises(FetchError, match="empty label in host"):
        _check_host(url)


@pytest.mark.parametrize("url", ["http://x.invalid/", "http://x.invalid./a/./b", "http://x.invalid/a..b",
                                 "http://[::1]/", "http://u@x.invalid/.a"])
def test_a_host_without_an_empty_label_passes(url: str) -> None:
    from distscrape_celery.web.fetch import _check_host

    _check_host(url)



def test_a_plain_url_goes_to_its_pool_directly_and_sends_what_the_manager_would(monkeypatch) -> None:
    """A plain URL of an origin asked before skips PoolManager.urlopen; the request on the
    wire is the same, on the same kept-alive connection."""
    import urllib3

    routes = {"/k/a.html": lambda h: reply(h, 200, b"direct"), "/k?q=1": lambda h: reply(h, 200, b"q")}
    fetch = fetcher()
    with serve(routes) as (base, _, log):
        assert fetch.get(base + "/k?q=1").body == b"q"  # not plain: through the manager
        assert fetch.get(base + "/k/a.html").body == b"direct"  # plain: the pool is picked once
        managed = urllib3.PoolManager.urlopen
        monkeypatch.setattr(urllib3.PoolManager, "urlopen",
                            lambda *a, **kw: pytest.fail("went through PoolManager.urlopen"))
        assert fetch.get(base + "/k/a.html").body == b"direct"
        monkeypatch.setattr(urllib3.PoolManager, "urlopen", managed)
        with pytest.raises(FetchError, match="connection refused"):  # another origin: its own pool
            fetch.get(f"http://127.0.0.1:{_closed_port()}/k/a.html")
    assert [entry["path"] for entry in log] == ["/k?q=1"] + ["/k/a.html"] * 2
    wire = [(e["headers"]["Host"], e["headers"]["User-Agent"], e["headers"]["Accept-Encoding"])
            for e in log]
    assert len(set(wire)) == 1 and wire[0][:2] == (base.split("//")[1], "test-agent/1.0")
    assert len({e["port"] for e in log}) == 1  # one kept-alive connection, whichever way


def _drip(first: bytes, dripped: bytes, pause: float = 0.3) -> Route:
    """A route that sends ``first`` at once, then ``dripped`` one byte every ``pause`` seconds:
    each byte well within read_timeout, the whole far beyond total_timeout."""

    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.close_connection = True
        handler.wfile.write(first)
        handler.wfile.flush()
        for byte in dripped:
            if release.wait(pause):
                return
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()

    release = threading.Event()
    route.release = release  # type: ignore[attr-defined]
    return route


# About 16 s of dripping at 0.3 s a byte: a fetch still going after 5 s is past its deadline.
_SLOW_HEADERS = b"X-Slow: " + b"a" * 20 + b"\r\nContent-Length: 2\r\n\r\nok"


@pytest.mark.parametrize(
    ("first", "dripped"),
    [(b"HTTP/1.1 200 OK\r\n", _SLOW_HEADERS),  # the headers drip
     (b"", b"HTTP/1.1 200 OK\r\n" + _SLOW_HEADERS),  # the status line itself drips
     # A body read up to the connection's end: cut at the deadline, it must not pass as whole.
     (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", _SLOW_HEADERS)],
    ids=["headers", "status-line", "body-to-close"],
)
def test_total_timeout_covers_a_dripping_status_line_headers_or_body(
    first: bytes, dripped: bytes
) -> None:
    slow = _drip(first, dripped)
    routes = {"/slow": slow, "/ok": lambda h: reply(h, 200, b"fine")}
    fetch = fetcher(read_timeout=2, total_timeout=1)
    with serve(routes) as (base, _, log):
        try:
            started = time.monotonic()
            error = fetch_error(fetch, base + "/slow")
            elapsed = time.monotonic() - started
            # The shut-down connection is not reused: the same thread's next fetch gets a new one.
            assert fetch.get(base + "/ok").body == b"fine"
        finally:
            slow.release.set()
    assert elapsed < 5  # the deadline, not the end of the drip (about 16 s), ended it
    assert error.retryable is True
    assert str(error) == f"timed out after 1s (total_timeout) fetching {base}/slow"
    assert [e["path"] for e in log] == ["/slow", "/ok"] and log[0]["port"] != log[1]["port"]


def test_total_timeout_covers_a_server_that_never_answers() -> None:
    # The port accepts (the kernel completes the handshake) but nothing ever reads or answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        started = time.monotonic()
        error = fetch_error(fetcher(read_timeout=30, total_timeout=1), url)
        elapsed = time.monotonic() - started
    assert elapsed < 5
    assert error.retryable is True
    assert str(error) == f"timed out after 1s (total_timeout) fetching {url}"


@contextmanager
def dripping_tcp_server(dripped: bytes, pause: float = 0.3) -> Iterator[int]:
    """A bare TCP server on 127.0.0.1 (yields its port) that sends each client ``dripped`` one
    byte every ``pause`` seconds, whatever the client says; for phases below HTTP (TLS)."""
    release = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_one(conn: socket.socket) -> None:
        with conn:
            for byte in dripped:
                if release.wait(pause):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return  # the client gave up, as it should

    def accept() -> None:
        while True:
            try:
                conn, _addr = listener.accept()
            except OSError:
                return  # closed at teardown
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        release.set()
        listener.close()


def test_total_timeout_covers_a_dripping_tls_handshake() -> None:
    # The start of a TLS handshake record announcing 16 kB, then its bytes one at a time. The
    # handshake as a whole has the socket's timeout: connect_timeout, here far above the total.
    with dripping_tcp_server(b"\x16\x03\x03\x40\x00" + b"\x02" * 50) as port:
        url = f"https://127.0.0.1:{port}/"
        started = time.monotonic()
        error = fetch_error(fetcher(connect_timeout=10, read_timeout=10, total_timeout=1), url)
        elapsed = time.monotonic() - started
    assert elapsed < 5  # the deadline, not the end of the drip (about 16 s), ended it
    assert error.retryable is True
    assert str(error) == f"timed out after 1s (total_timeout) fetching {url}"


def test_one_watchdog_thread_bounds_every_thread_of_a_pool() -> None:
    """Threads of one process sharing a fetcher (a threads pool), all stuck in dripping headers,
    all get their thread back at their deadline; one watchdog thread serves them all."""
    slow = _drip(b"HTTP/1.1 200 OK\r\n", _SLOW_HEADERS)
    fetch = fetcher(read_timeout=2, total_timeout=1)
    errors: list[str] = []
    with serve({"/slow": slow}) as (base, _, _log):
        try:
            def stuck_fetch() -> None:
                errors.append(str(fetch_error(fetch, base + "/slow")))

            threads = [threading.Thread(target=stuck_fetch) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(5)
            stuck = [thread for thread in threads if thread.is_alive()]
        finally:
            slow.release.set()
    assert not stuck
    assert errors == [f"timed out after 1s (total_timeout) fetching {base}/slow"] * 4
    assert [t.name for t in threading.enumerate()].count("distscrape-deadlines") == 1


def test_nested_gzip_bomb_stops_at_max_bytes_in_bounded_memory() -> None:
    import tracemalloc

    bomb = nested_gzip_bomb()
    assert len(bomb) < 2048
    routes = {"/bomb": lambda h: reply(h, 200, bomb, {"Content-Encoding": "gzip, gzip"})}
    with serve(routes) as (base, _, _log):
        fetch = fetcher(max_bytes=1_000_000, total_timeout=30)
        tracemalloc.start()
        try:
            started = time.monotonic()
            error = fetch_error(fetch, base + "/bomb")
            elapsed = time.monotonic() - started
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # Decoding stops near max_bytes: urllib3 before 2.6 expanded all 256 MiB first.
    assert peak < 100 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB while decoding"
    assert elapsed < 10
    assert str(error) == f"body of {base}/bomb exceeds max_bytes=1000000"


def test_installed_urllib3_is_one_that_bounds_decompression() -> None:
    """pyproject.toml's floor for urllib3 bounds streamed decompression (urllib3 2.6.0: chained
    encodings, max_length; 2.7.0: Brotli and drain_conn; 2.8.0: a chunked deflate loop), and
    the urllib3 in use meets it."""
    import urllib3
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version

    pyproject = REPO_ROOT / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    (requirement,) = [r for r in map(Requirement, declared) if r.name == "urllib3"]
    floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    assert floors and min(floors) >= Version("2.8.0"), requirement
    assert requirement.specifier.contains(urllib3.__version__), urllib3.__version__
