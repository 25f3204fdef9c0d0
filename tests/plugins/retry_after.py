"""A scraper whose fetch errors carry the server's ``Retry-After`` (seconds) as ``retry_after``,
standing in for the fetcher's own parsing (issue 7's other half) so that the pipeline's handling
of it can be tested through real workers now."""

from __future__ import annotations

from distscrape_celery import fetch
from distscrape_celery.errors import FetchError
from distscrape_celery.scrapers import SimpleScraper

_check_status = fetch._check_status


def _check_status_with_retry_after(response) -> None:
    try:
        _check_status(response)
    except FetchError as exc:
        value = response.headers.get("Retry-After", "")
        if value.isdigit():
            exc.retry_after = float(value)
        raise


class RetryAfterScraper(SimpleScraper):
    @classmethod
    def from_spec(cls, spec):
        fetch._check_status = _check_status_with_retry_after
        return super().from_spec(spec)
