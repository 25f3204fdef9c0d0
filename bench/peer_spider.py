"""The peers' spider: a Scrapy CrawlSpider (or scrapy-redis's RedisCrawlSpider) that follows every
link within the site's hosts and writes each page's body to a file, as our crawler's saver does.

    BENCH_SPIDER=spider.json BENCH_OUT=DIR bench/.venv-peers/bin/scrapy runspider bench/peer_spider.py

Run by ``bench.peers`` with the peers' Python (``bench/.venv-peers``), never imported by the
benchmarks (they have no Scrapy). ``BENCH_SPIDER`` names a JSON file: ``domains`` (the allowed
hosts), ``settings`` (the spider's custom settings), and either ``start_urls`` or ``redis_key``
(scrapy-redis: the Redis list the start URLs are read from).
"""

import hashlib
import json
import os

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

with open(os.environ["BENCH_SPIDER"]) as config_file:
    CONFIG = json.load(config_file)

if CONFIG.get("redis_key"):
    from scrapy_redis.spiders import RedisCrawlSpider as BaseSpider
else:
    BaseSpider = CrawlSpider


class Bench(BaseSpider):
    name = "bench"
    allowed_domains = CONFIG["domains"]
    if CONFIG.get("redis_key"):
        redis_key = CONFIG["redis_key"]
    else:
        start_urls = CONFIG["start_urls"]
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=True),)
    custom_settings = CONFIG["settings"]

    def parse_start_url(self, response, **kwargs):
        return self.parse_item(response)

    def parse_item(self, response):
        name = hashlib.sha1(response.url.encode()).hexdigest()
        with open(os.path.join(os.environ["BENCH_OUT"], name), "wb") as fh:
            fh.write(response.body)
        return None
