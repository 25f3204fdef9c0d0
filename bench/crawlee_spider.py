"""The Crawlee peer's spider: a ParselCrawler that follows every link within the start URLs' hosts
and writes each page's body to a file named by the SHA-1 of its URL, as ``peer_spider.py`` does.

    BENCH_OUT=DIR bench/.venv-crawlee/bin/python bench/crawlee_spider.py --max-pages N URL...

Run by ``bench.crawlee_peer`` with Crawlee's own Python (``bench/.venv-crawlee``), never imported
by the benchmarks. Its settings are the fastest found for a crawl of a local site: request queue,
datasets and state in memory, a fixed number of requests in flight (no autoscaling), Crawlee's
default HTTP client (impit: less CPU a page than curl-impersonate and httpx), no session pool, no
periodic status, statistics or system-info work within a crawl.
"""

import argparse
import asyncio
import hashlib
import logging
import os
from datetime import timedelta

from crawlee import ConcurrencySettings, service_locator
from crawlee.configuration import Configuration
from crawlee.crawlers import ParselCrawler, ParselCrawlingContext
from crawlee.events import LocalEventManager
from crawlee.http_clients import ImpitHttpClient
from crawlee.statistics import Statistics
from crawlee.storage_clients import MemoryStorageClient

# Longer than any crawl: the periodic status and statistics lines, the state persistence and the
# system-info sampling (which only autoscaling reads) happen at most once.
QUIET = timedelta(hours=1)


async def crawl(urls: list[str], max_pages: int, concurrency: int) -> None:
    out = os.environ["BENCH_OUT"]
    config = Configuration(purge_on_start=True, system_info_interval=QUIET,
                           persist_state_interval=QUIET)
    # Set for every component at once: given only to the crawler, some would make their own.
    service_locator.set_configuration(config)
    service_locator.set_event_manager(LocalEventManager.from_config(config))
    service_locator.set_storage_client(MemoryStorageClient())
    crawler = ParselCrawler(
        http_client=ImpitHttpClient(),
        concurrency_settings=ConcurrencySettings(
            min_concurrency=concurrency, desired_concurrency=concurrency,
            max_concurrency=concurrency),
        max_requests_per_crawl=max_pages or None,
        use_session_pool=False,
        status_message_logging_interval=QUIET,
        statistics=Statistics.with_default_state(log_interval=QUIET),
        configure_logging=False,
    )

    @crawler.router.default_handler
    async def page(context: ParselCrawlingContext) -> None:
        name = hashlib.sha1(context.request.url.encode()).hexdigest()
        with open(os.path.join(out, name), "wb") as fh:
            fh.write(await context.http_response.read())
        await context.enqueue_links(strategy="same-hostname")

    await crawler.run(urls)


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_argument("urls", nargs="+")
    options.add_argument("--max-pages", type=int, default=0, help="0: the whole site")
    options.add_argument("--concurrency", type=int, default=64)
    args = options.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(crawl(args.urls, args.max_pages, args.concurrency))


if __name__ == "__main__":
    main()
