"""What happens to one item: lease, download, find new items, stage, save, complete.

Celery-free so it can be tested and reasoned about alone; ``worker/tasks.py`` wraps it. The rules
that keep data safe: an item is completed only after its saver returned; the items found in a
page are queued before its save can complete it; every failure path either hands the item back
to the tracker under its fencing token or leaves it in flight so that its deadline expires; and
every attempt counts, against ``max_retries`` when the item's download or save raised, against
``max_lost`` when the process holding it vanished.

:class:`ItemPipeline` (``item_pipeline.py``) joins the parts: ``scraping.py`` (a leased page,
step by step), ``saving.py`` (save tasks and save batches), ``scraped_saves.py`` (scraped pages
waiting in this process for their save batch), ``links.py`` (the links a page hands on),
``fetch_rules.py`` (robots.txt and the host scope of a download), ``failures.py`` (handing an
item back) and ``publishing.py`` (what goes to the broker).
"""

from .item_pipeline import ItemPipeline
from .publishing import Publisher

__all__ = ["ItemPipeline", "Publisher"]
