"""The Celery tasks: thin wrappers that hand each item to :class:`~.pipeline.ItemPipeline`."""

from __future__ import annotations

from collections.abc import Sequence

from .celery_app import SAVE_TASK, SCRAPE_TASK, app, current_settings
from .pipeline import ItemPipeline
from .runtime import current_runtime


class CeleryPublisher:
    """Publishes our tasks, reusing one producer connection for a batch."""

    def scrape(self, job: str, items: Sequence[str]) -> None:
        with app.producer_or_acquire() as producer:
            for item in items:
                scrape.apply_async((job, item), producer=producer)

    def save(self, job: str, item: str, token: int, meta: dict, delay: float = 0) -> None:
        save.apply_async((job, item, token, meta), countdown=delay or None)


publisher = CeleryPublisher()


def pipeline() -> ItemPipeline:
    return ItemPipeline(current_runtime(current_settings), publisher)


@app.task(name=SCRAPE_TASK, ignore_result=True)
def scrape(job: str, item: str) -> str:
    """Download one item (URL or ID), queue the items found in it, and chain its save task."""
    return pipeline().scrape(job, item)


@app.task(name=SAVE_TASK, ignore_result=True)
def save(job: str, item: str, token: int, meta: dict) -> str:
    """Store one downloaded item (scraped under lease ``token``) through the job's saver, then
    mark it done."""
    return pipeline().save(job, item, token, meta)
