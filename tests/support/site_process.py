"""Serve a generated site from its own process (run inside a test's network namespace).

    python -m tests.support.site_process HOST PAGES SEED DELAY LOG_JSON   (from the repository root)

Prints the port once it listens; serves until its stdin closes, then writes the request log
(paths in arrival order) to LOG_JSON as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from distscrape_celery.testing.sitegen import SiteServer, generate_site


def main() -> None:
    host, pages, seed, delay, log = sys.argv[1:6]
    site = generate_site(n_pages=int(pages), seed=int(seed))
    with SiteServer(site, delay=float(delay), host=host) as server:
        print(server.port, flush=True)
        sys.stdin.read()
        Path(log).write_text(json.dumps(server.requests))


if __name__ == "__main__":
    main()
