#!/usr/bin/env python
"""CPU of finding a page's links: ``python bench/bench_links.py [--pages 4000] [--rounds 3]``.

``SimpleScraper.find_items`` over the benchmark site's pages (tests/sitegen.py, as bench/suite.py
serves it), each page handed to one of four scrapers in turn as four worker processes would
share a crawl, with the fast paths for plain links (issue 9) and, in the same run, without them
(every link through urljoin and w3lib). Prints microseconds of CPU a page for each.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from sitegen import generate_site  # noqa: E402

from distscrape_celery.web.fetch import Download  # noqa: E402
from distscrape_celery.web.scope import LinkScope  # noqa: E402
from distscrape_celery.scrapers import simple  # noqa: E402
from distscrape_celery.scrapers.simple import SimpleScraper  # noqa: E402

NEVER = re.compile(r"(?!)")


def per_page(pages: list[tuple[str, bytes]]) -> tuple[float, float]:
    """(CPU us a page, links found a page) with four scrapers taking pages in turn."""
    scrapers = [SimpleScraper(LinkScope(hosts=["127.0.0.1"])) for _ in range(4)]
    found = 0
    start = time.process_time()
    for i, (url, body) in enumerate(pages):
        download = Download(url=url, status=200, content_type="text/html", body=body)
        found += len(scrapers[i % 4].find_items(url, download))
    return (time.process_time() - start) / len(pages) * 1e6, found / len(pages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    site = generate_site(n_pages=args.pages, seed=1, page_padding=6000 - 400)
    pages = [(f"http://127.0.0.1:8080{path}", body) for path, body in site.pages.items()]
    random.Random(1).shuffle(pages)
    slow = [mock.patch.object(simple, "_PLAIN_HREF", NEVER),
            mock.patch.object(simple, "is_plain_url", lambda url: False),
            mock.patch("distscrape_celery.job.urls._PLAIN_URL", NEVER)]
    for n in range(args.rounds):
        fast, links = per_page(pages)
        for patch in slow:
            patch.start()
        try:
            without, links_without = per_page(pages)
        finally:
            for patch in slow:
                patch.stop()
        assert links == links_without
        print(f"round {n + 1}: {fast:.0f} us a page with the fast paths, {without:.0f} without "
              f"({links:.1f} links a page)")


if __name__ == "__main__":
    main()
