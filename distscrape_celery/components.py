"""Building the scraper and saver a job's spec names.

Each kind maps to a dotted path, so adding an implementation is one line here (and, later, a user's
own ``module:Class`` from the spec).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Optional

from .errors import ConfigError
from .jobspec import JobSpec
from .savers import ItemSaver
from .scrapers import Scraper

SCRAPERS = {
    "simple": "distscrape_celery.scrapers:SimpleScraper",
    "ids": "distscrape_celery.scrapers:IDScraper",
}
SAVERS = {
    "files": "distscrape_celery.savers:FileItemSaver",
    "redis": "distscrape_celery.savers:RedisItemSaver",
    "tar": "distscrape_celery.savers:TarItemSaver",
    "warc": "distscrape_celery.savers:WarcItemSaver",
}


def load_class(path: str, base: type) -> type:
    """Import ``module:Class`` and check that it subclasses ``base``."""
    module_name, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {path!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(
            f"{path!r} is not a subclass of {base.__name__} (which must implement "
            f"{', '.join(sorted(getattr(base, '__abstractmethods__', ())))})"
        )
    return cls


def check_components(spec: JobSpec, names: Optional[Mapping[str, str]] = None) -> None:
    """Check that the scraper and saver ``spec`` names can be loaded here (the seeding machine),
    so a bad dotted path is a clear error at seed time, not one failed item after another.
    The error names the field as ``names`` calls it (``scraper.kind`` -> ``--scraper``)."""
    for field, kind, builtin, base in (
        ("scraper.kind", spec.scraper.kind, SCRAPERS, Scraper),
        ("saver.kind", spec.saver.kind, SAVERS, ItemSaver),
    ):
        try:
            load_class(builtin.get(kind, kind), base)
        except ConfigError as exc:
            raise ConfigError(f"{(names or {}).get(field, field)}: {exc}") from None


def build_scraper(spec: JobSpec) -> Scraper:
    kind = spec.scraper.kind
    return load_class(SCRAPERS.get(kind, kind), Scraper).from_spec(spec)


def build_saver(spec: JobSpec, job: str, worker_id: str) -> ItemSaver:
    kind = spec.saver.kind
    return load_class(SAVERS.get(kind, kind), ItemSaver).from_spec(
        spec.saver, job=job, worker_id=worker_id
    )
