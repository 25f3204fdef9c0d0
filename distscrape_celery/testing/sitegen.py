"""Deterministic synthetic web sites and a tiny local HTTP server for them.

Standard library only.  Imported by the tests and the benchmarks as
``from distscrape_celery.testing.sitegen import ...``; served from the command line by
:mod:`distscrape_celery.testing.local_site`.

* :func:`generate_site` builds a :class:`Site`: a dict ``path -> HTML bytes`` plus the
  set of paths reachable from ``"/"`` and the set of orphan pages nothing links to.
  Reachability is computed by BFS over the generator's *own* link list (``Site.links``),
  resolved with :func:`resolve` -- never by parsing the HTML with the code under test.
* :class:`SiteServer` serves a :class:`Site` on ``127.0.0.1`` (port chosen by the OS),
  HTTP/1.1 keep-alive, with an optional per-request delay and a thread-safe request log.

Off-site links always point at hosts under ``.invalid`` (never resolvable).
"""

from __future__ import annotations

import collections
import hashlib
import html
import posixpath
import random
import socket
import threading
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urljoin, urlsplit

__all__ = ["Site", "SiteChange", "generate_site", "evolve_site", "resolve", "SiteServer", "QuietServer"]

_RESOLVE_BASE = "http://site.invalid"
_FILLER = (
    b"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod "
    b"tempor incididunt ut labore et dolore magna aliqua. "
)


@dataclass
class Site:
    """A generated site.

    pages:       URL path (with query, if any) -> HTML body served there.
    reachable:   paths reachable from "/" by following the site's own links.
    unreachable: pages that exist but that no page links to.
    links:       path -> hrefs exactly as written in that page's HTML (the link graph).
    """

    pages: dict[str, bytes]
    reachable: set[str]
    unreachable: set[str]
    links: dict[str, list[str]] = field(default_factory=dict)


def resolve(page_path: str, href: str) -> str | None:
    """Resolve ``href`` as found on ``page_path``; return the on-site path (+ query) or None.

    The fragment is dropped; links to another host or scheme (off-site, mailto:) give None.
    """
    base = _RESOLVE_BASE + page_path
    absolute = urljoin(base, href)
    parts = urlsplit(absolute)
    if parts.scheme not in ("http", "https") or parts.netloc != "site.invalid":
        return None
    path = parts.path or "/"
    return path + ("?" + parts.query if parts.query else "")


# --------------------------------------------------------------------------- generation


def _dir_of(path: str) -> str:
    """Directory used to resolve relative links on the page at ``path``."""
    path = path.split("?", 1)[0]
    return path if path.endswith("/") else posixpath.dirname(path) or "/"


def _relative(from_path: str, to_path: str) -> str:
    """A relative reference from the page ``from_path`` to ``to_path`` (which may have a query)."""
    to, _, query = to_path.partition("?")
    from_dir = _dir_of(from_path)
    if to.endswith("/"):
        rel = posixpath.relpath(to.rstrip("/") or "/", from_dir)
        rel = "./" if rel == "." else rel + "/"
    else:
        rel = posixpath.relpath(to, from_dir)
    return rel + ("?" + query if query else "")


def _href(rng: random.Random, from_path: str, to_path: str) -> str:
    """Write a link from ``from_path`` to ``to_path`` in one of several equivalent forms."""
    form = rng.random()
    if form < 0.35:
        href = to_path  # absolute path
    else:
        href = _relative(from_path, to_path)  # "4.html", "../p/3.html", "../../", "./" ...
        if form < 0.5 and not href.startswith("."):
            href = "./" + href  # "./4.html"
    if rng.random() < 0.15:
        href += rng.choice(("#top", "#main", "#section"))
    return href


def _allocate_paths(n_pages: int, rng: random.Random) -> list[str]:
    """n_pages distinct on-site paths, "/" first, the rest in shuffled order: section indexes
    (``/sec/K/``), pages in sections, query-string pages (``/q?id=N``) and plain pages."""
    rest = n_pages - 1
    sections = min(rest, max(1, rest // 20)) if rest >= 3 else 0
    queries = min(rest - sections, max(1, rest // 30)) if rest >= 2 else 0
    in_sections = (rest - sections - queries) // 4 if sections else 0
    plain = rest - sections - queries - in_sections
    paths = [f"/sec/{k}/" for k in range(sections)]
    paths += [f"/sec/{j % sections}/{j}.html" for j in range(in_sections)]
    paths += [f"/q?id={i}" for i in range(queries)]
    paths += [f"/p/{i}.html" for i in range(plain)]
    rng.shuffle(paths)
    return ["/"] + paths


def _render(path: str, hrefs: list[str], page_padding: int) -> bytes:
    title = html.escape(path)
    items = "\n".join(
        f'    <li><a href="{html.escape(h, quote=True)}">link {n}</a></li>' for n, h in enumerate(hrefs)
    )
    pad = b""
    if page_padding > 0:
        reps = page_padding // len(_FILLER) + 1
        pad = (_FILLER * reps)[:page_padding]
    head = (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        '<meta charset="utf-8">\n'
        f"<title>{title}</title>\n"
        "</head>\n<body>\n"
        f'<h1 id="top">{title}</h1>\n'
        f'<ul id="main">\n{items}\n</ul>\n'
        '<h2 id="section">Section</h2>\n'
        '<p class="pad">'
    )
    tail = "</p>\n</body>\n</html>\n"
    return head.encode("utf-8") + pad + tail.encode("utf-8")


def generate_site(
    n_pages: int = 300,
    seed: int = 0,
    unreachable: int = 10,
    page_padding: int = 0,
    link_fanout: int = 6,
) -> Site:
    """Generate a deterministic site: the same arguments give the same pages, byte for byte.

    ``n_pages`` pages (including "/") are reachable from "/"; ``unreachable`` further
    orphan pages exist but are linked from nowhere, so ``len(site.pages) ==
    n_pages + unreachable``.  Each page links to about ``link_fanout`` on-site pages
    (plus a link back to "/", sometimes a "#section" self-link, off-site
    ``*.example.invalid`` links and mailto: links).  ``page_padding`` bytes of filler
    text are added to every page body.
    """
    if n_pages < 1:
        raise ValueError("n_pages must be >= 1")
    if unreachable < 0:
        raise ValueError("unreachable must be >= 0")
    rng = random.Random(seed)
    order = _allocate_paths(n_pages, rng)

    # Orphans: extra /p/ pages numbered past the reachable ones, and /orphan/ pages.
    numbered = sum(1 for path in order if path.startswith("/p/"))
    orphans = [f"/p/{numbered + i}.html" if i % 2 == 0 else f"/orphan/{i}.html"
               for i in range(unreachable)]
    children = _spanning_tree(order, rng)
    links = {path: _page_links(path, children.get(path, []), order, link_fanout, rng)
             for path in order + orphans}
    reachable, orphan_set = _check_graph(links, order, orphans)
    pages = {path: _render(path, links[path], page_padding) for path in order + orphans}
    return Site(pages=pages, reachable=reachable, unreachable=orphan_set, links=links)


@dataclass
class SiteChange:
    """A site after :func:`evolve_site`, and how it differs from the one before: the pages whose
    body changed, those added (each linked from a changed page) and those removed."""

    site: Site
    changed: set[str]
    added: set[str]
    removed: set[str]


def evolve_site(site: Site, seed: int = 1, change: float = 0.10, add: float = 0.02,
                remove: float = 0.02) -> SiteChange:
    """The next version of ``site``, as a site changes between two crawls: of its reachable pages
    but "/", a ``change`` share get a new paragraph, an ``add`` share of new pages appear (each
    linked from one of the changed pages) and a ``remove`` share are gone (404). Deterministic
    for the same arguments."""
    rng = random.Random(seed)
    paths = sorted(path for path in site.reachable if path != "/")
    removed = set(rng.sample(paths, round(len(paths) * remove)))
    kept = [path for path in paths if path not in removed]
    changed = set(rng.sample(kept, max(1, round(len(paths) * change))))
    added = {f"/new/{seed}/{i}.html" for i in range(round(len(paths) * add))}
    anchors: dict[str, list[str]] = {path: [] for path in changed}
    hosts = sorted(changed)
    for path in sorted(added):
        anchors[rng.choice(hosts)].append(path)
    pages = {path: body for path, body in site.pages.items() if path not in removed}
    links = {path: list(hrefs) for path, hrefs in site.links.items() if path not in removed}
    for path in changed:
        extra = "".join(f' <a href="{new}">new</a>' for new in anchors[path])
        pages[path] = site.pages[path].replace(
            b"</body>", f"<p>revision {seed}{extra}</p>\n</body>".encode(), 1)
        links[path] = links.get(path, []) + anchors[path]
    for path in added:
        pages[path] = _render(path, ["/"], 0)
        links[path] = ["/"]
    new_site = Site(pages=pages, reachable=(site.reachable - removed) | added,
                    unreachable=site.unreachable - removed, links=links)
    return SiteChange(new_site, changed, added, removed)


def _spanning_tree(order: list[str], rng: random.Random) -> dict[str, list[str]]:
    """Each page's children in a tree from "/": a page's parent is an earlier page (often a
    recent one), so everything in ``order`` is reachable."""
    children: dict[str, list[str]] = {path: [] for path in order}
    for index in range(1, len(order)):
        lowest = max(0, index - 12) if rng.random() < 0.7 else 0
        children[order[rng.randrange(lowest, index)]].append(order[index])
    return children


def _page_links(path: str, children: list[str], order: list[str], link_fanout: int,
                rng: random.Random) -> list[str]:
    """The hrefs of the page at ``path``, as written in its HTML: its children, random back
    edges up to ``link_fanout`` (cycles), "/", and now and then a self-link, off-site links to
    ``.invalid`` names and a mailto: link."""
    wanted = list(children)
    while len(wanted) < link_fanout and len(order) > 1:
        other = order[rng.randrange(len(order))]
        if other != path:
            wanted.append(other)
    if path != "/":
        wanted.append("/")  # every page links home: cycles guaranteed
    rng.shuffle(wanted)
    hrefs = [_href(rng, path, target) for target in wanted]
    if rng.random() < 0.3:
        hrefs.insert(rng.randrange(len(hrefs) + 1), "#section")
    if rng.random() < 0.4:
        host = rng.randrange(50)
        hrefs.append(f"http://host-{host}.example.invalid/page/{rng.randrange(1000)}.html")
    if rng.random() < 0.1:
        hrefs.append(f"https://offsite-{rng.randrange(50)}.example.invalid/")
    if rng.random() < 0.1:
        hrefs.append(f"mailto:user{rng.randrange(100)}@example.invalid")
    return hrefs


def _check_graph(links: dict[str, list[str]], order: list[str],
                 orphans: list[str]) -> tuple[set[str], set[str]]:
    """The pages reachable from "/" and those nothing links to, by a walk over the generator's
    own link graph; raise AssertionError if either differs from what the generator meant."""
    all_pages = set(order) | set(orphans)
    for path, hrefs in links.items():
        for href in hrefs:
            target = resolve(path, href)
            if target is not None and target not in all_pages:  # pragma: no cover - a bug
                raise AssertionError(f"{path}: {href!r} resolves to missing page {target!r}")
    reachable = {"/"}
    queue = deque(["/"])
    while queue:
        current = queue.popleft()
        for href in links[current]:
            target = resolve(current, href)
            if target is not None and target not in reachable:
                reachable.add(target)
                queue.append(target)
    linked_to = {target for path, hrefs in links.items() for href in hrefs
                 if (target := resolve(path, href)) is not None and target != path}
    orphan_set = {path for path in all_pages if path != "/" and path not in linked_to}
    if reachable != set(order) or orphan_set != set(orphans):  # pragma: no cover
        raise AssertionError("generator invariant violated")
    return reachable, orphan_set


# --------------------------------------------------------------------------- server


class QuietServer(ThreadingHTTPServer):
    """A threading HTTP server that does not print a traceback when a crawler it serves hangs
    up mid-answer (killed workers, cancelled downloads): that is expected of a crawl."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the second waits ~40 ms for the
    # client's delayed ACK, and every crawl would measure that stall instead of the crawler.
    disable_nagle_algorithm = True
    server_version = "sitegen/1.0"
    timeout = 60  # idle keep-alive connections do not linger forever

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, False)

    def log_message(self, format: str, *args) -> None:  # quiet
        pass

    def _target(self) -> str:
        raw = self.path
        if "://" in raw.split("?", 1)[0]:  # absolute-form request target
            parts = urlsplit(raw)
            raw = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        return raw.split("#", 1)[0]

    def _respond(self, with_body: bool) -> None:
        owner = self.server.owner
        path = self._target()
        owner._log(path)
        if owner.delay > 0:
            time.sleep(owner.delay)
        body = owner.site.pages.get(path)
        validators: list[tuple[str, str]] = []
        if body is None:
            body = b"<!DOCTYPE html><html><head><title>404</title></head><body>Not Found</body></html>\n"
            self.send_response(404)
        else:
            if owner.validators:
                etag, modified = owner._validators(path, body)
                validators = [("ETag", etag), ("Last-Modified", formatdate(modified, usegmt=True))]
                if self._not_modified(etag, modified):
                    self.send_response(304)
                    for name, value in validators:
                        self.send_header(name, value)
                    self.end_headers()
                    return
            self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in validators:
            self.send_header(name, value)
        self.end_headers()
        if with_body:
            self.wfile.write(body)
            owner._sent(len(body))

    def _not_modified(self, etag: str, modified: float) -> bool:
        """Whether the request's validators match (If-None-Match first, as RFC 9110 says)."""
        match = self.headers.get("If-None-Match")
        if match is not None:
            return etag in [tag.strip() for tag in match.split(",")]
        since = self.headers.get("If-Modified-Since")
        if since is None:
            return False
        try:
            return modified <= parsedate_to_datetime(since).timestamp()
        except (TypeError, ValueError):
            return False

    def do_GET(self) -> None:
        self._respond(True)

    def do_HEAD(self) -> None:
        self._respond(False)


class _Server(QuietServer):
    daemon_threads = True
    allow_reuse_address = True


class SiteServer:
    """Serve a :class:`Site` on 127.0.0.1 (``port``, or one the OS chooses) from a daemon thread. ``host`` may
    name another address only inside a network namespace a test made itself.

    Starts on construction; use as a context manager or call :meth:`stop`.
    """

    def __init__(self, site: Site, delay: float = 0.0, host: str = "127.0.0.1",
                 port: int = 0, validators: bool = False) -> None:
        self.site = site
        self.delay = delay
        # Send ETag and Last-Modified, and answer 304 to a request whose validators match (as
        # nginx does for static files); a page's Last-Modified is when replace_site changed it.
        self.validators = validators
        self._modified: dict[str, float] = {}
        self._started = float(int(time.time()))
        self._body_bytes = 0
        self._lock = threading.Lock()
        self._requests: list[str] = []
        self._times: list[float] = []  # when each request of _requests arrived (Unix time)
        self._robots_requests = 0
        self._conns: set[socket.socket] = set()
        self._stopped = False
        self._httpd = _Server((host, port), _Handler)
        self._httpd.owner = self
        self.port: int = self._httpd.server_address[1]
        self.base_url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"SiteServer:{self.port}", daemon=True
        )
        self._thread.start()

    # -- public API
    def url(self, path: str = "/") -> str:
        if not path.startswith("/"):
            path = "/" + path
        return self.base_url + path

    @property
    def requests(self) -> list[str]:
        """Copy of the request log: request paths (with query) in arrival order. A crawler's
        ``/robots.txt`` requests are left out (see :attr:`robots_requests`)."""
        with self._lock:
            return list(self._requests)

    @property
    def robots_requests(self) -> int:
        """How many times ``/robots.txt`` was requested (a site never has that page)."""
        with self._lock:
            return self._robots_requests

    def request_times(self, path: str | None = None) -> list[float]:
        """When ``path`` was requested (Unix time), in order; without ``path``, when each request
        of :attr:`requests` arrived."""
        with self._lock:
            if path is None:
                return list(self._times)
            return [t for p, t in zip(self._requests, self._times) if p == path]

    def counts(self) -> collections.Counter:
        with self._lock:
            return collections.Counter(self._requests)

    @property
    def body_bytes(self) -> int:
        """The bytes of every body sent so far (304s and HEADs send none)."""
        with self._lock:
            return self._body_bytes

    def replace_site(self, site: Site) -> None:
        """Serve ``site`` from now on; the pages whose body differs are modified now (their
        Last-Modified is a whole second past any earlier one)."""
        now = float(int(time.time()) + 1)
        with self._lock:
            for path, body in site.pages.items():
                if self.site.pages.get(path) != body:
                    self._modified[path] = now
            self.site = site

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            conns = list(self._conns)
        self._httpd.shutdown()
        self._httpd.server_close()
        for conn in conns:  # wake handler threads parked on idle keep-alive connections
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join()

    def __enter__(self) -> "SiteServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals used by the handler
    def _log(self, path: str) -> None:
        with self._lock:
            if path == "/robots.txt":
                self._robots_requests += 1
            else:
                self._requests.append(path)
                self._times.append(time.time())

    def _sent(self, n: int) -> None:
        with self._lock:
            self._body_bytes += n

    def _validators(self, path: str, body: bytes) -> tuple[str, float]:
        with self._lock:
            modified = self._modified.get(path, self._started)
        return f'"{hashlib.sha1(body).hexdigest()[:16]}"', modified

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)
