"""Building the scraper and saver a job's spec names.

Each kind maps to a dotted path, so adding an implementation is one line here. A spec may also
name a class of its own as ``module:Class``; since a spec comes from whoever can write to the
tracker's Redis, a process imports such a module only if its own settings allow it
(``plugin_modules``), and a file-writing saver writes only under the settings' ``output_roots``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from typing import Optional

from ..errors import ConfigError, OutputNotAllowed, PluginNotAllowed
from ..job.spec import JobSpec
from ..savers import ItemSaver
from ..savers.files import FileItemSaver
from ..savers.shards import ShardedItemSaver
from ..scrapers import Scraper
from ..settings import ENV_PREFIX, Settings, is_dotted_name

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
# The built-in classes, by kind or by their own path, need no allow-list; nothing else of this
# package does either (importing an arbitrary module of ours is no business of a spec).
BUILTIN_PATHS = frozenset(SCRAPERS.values()) | frozenset(SAVERS.values())
# Savers whose output is a path on this host: confined under ``output_roots``.
PATH_SAVERS = (FileItemSaver, ShardedItemSaver)


def module_allowed(module: str, allowed: Iterable[str]) -> bool:
    """Whether ``module`` is one of ``allowed`` or inside one, on whole dotted components
    (``mypkg`` allows ``mypkg.x``, not ``mypkgx``)."""
    return is_dotted_name(module) and any(
        module == prefix or module.startswith(prefix + ".") for prefix in allowed
    )


def check_plugin(path: str, settings: Settings) -> None:
    """Raise :class:`PluginNotAllowed` unless ``path`` (``module:Class``) is a built-in class or
    its module is allowed by ``settings.plugin_modules``. Imports nothing."""
    if path in BUILTIN_PATHS:
        return
    module = path.partition(":")[0]
    if not is_dotted_name(module):
        raise ConfigError(f"{path!r}: {module!r} is not a dotted module name")
    if not module_allowed(module, settings.plugin_modules):
        allowed = ", ".join(settings.plugin_modules) or "none: the built-in kinds only"
        raise PluginNotAllowed(
            f"{path!r}: module {module!r} is not allowed by this process's "
            f"{ENV_PREFIX}PLUGIN_MODULES ({allowed}), so it was not imported"
        )


def load_class(path: str, base: type, settings: Settings) -> type:
    """Import ``module:Class``, if ``settings`` allow its module (checked first), and check that
    it subclasses ``base``."""
    check_plugin(path, settings)
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


def check_output(output: str, settings: Settings) -> None:
    """Raise :class:`OutputNotAllowed` unless the path ``output``, resolved (symlinks followed,
    relative to this process's directory), lies under one of ``settings.output_roots`` (unset:
    anywhere)."""
    roots = settings.output_roots
    if roots is None:
        return
    real = os.path.realpath(output)
    for root in roots:
        real_root = os.path.realpath(root)
        if os.path.commonpath([real_root, real]) == real_root:
            return
    resolved = f" (resolved: {real!r})" if real != output else ""
    raise OutputNotAllowed(
        f"{output!r}{resolved} is not under this process's {ENV_PREFIX}OUTPUT_ROOTS "
        f"({', '.join(roots)})"
    )


def _component(field: str, kind: str, builtin: Mapping[str, str], base: type,
               settings: Settings, names: Mapping[str, str]) -> type:
    """The class ``kind`` names, for the spec's ``field``; an error names the field as
    ``names`` calls it."""
    try:
        return load_class(builtin.get(kind, kind), base, settings)
    except ConfigError as exc:
        raise type(exc)(f"{names.get(field, field)}: {exc}") from None


def _saver_class(spec: JobSpec, settings: Settings, names: Mapping[str, str]) -> type:
    """The saver class of ``spec``, its output checked against ``settings.output_roots``."""
    cls = _component("saver.kind", spec.saver.kind, SAVERS, ItemSaver, settings, names)
    if issubclass(cls, PATH_SAVERS):
        try:
            check_output(spec.saver.output, settings)
        except OutputNotAllowed as exc:
            raise OutputNotAllowed(f"{names.get('saver.output', 'saver.output')}: {exc}") from None
    return cls


def check_components(
    spec: JobSpec, settings: Settings, names: Optional[Mapping[str, str]] = None
) -> None:
    """Check that the scraper and saver ``spec`` names can be loaded by this process (the
    seeding one) under its ``settings``, so a bad or refused dotted path, or an output outside
    the allowed roots, is a clear error at seed time, not one dead item after another. The error
    names the field as ``names`` calls it (``scraper.kind`` -> ``--scraper``)."""
    _component("scraper.kind", spec.scraper.kind, SCRAPERS, Scraper, settings, names or {})
    _saver_class(spec, settings, names or {})


def spec_plugin_modules(spec: JobSpec) -> tuple[str, ...]:
    """The modules of the classes ``spec`` names that are not built in (well-formed names
    only: :func:`check_plugin` refuses the others)."""
    paths = (SCRAPERS.get(spec.scraper.kind, spec.scraper.kind),
             SAVERS.get(spec.saver.kind, spec.saver.kind))
    modules = (p.partition(":")[0] for p in paths if p not in BUILTIN_PATHS)
    return tuple(dict.fromkeys(m for m in modules if is_dotted_name(m)))


def build_scraper(spec: JobSpec, settings: Settings) -> Scraper:
    """The job's scraper, if ``settings`` allow its class (:class:`PluginNotAllowed`)."""
    return _component(
        "scraper.kind", spec.scraper.kind, SCRAPERS, Scraper, settings, {}
    ).from_spec(spec)


def build_saver(spec: JobSpec, job: str, worker_id: str, settings: Settings) -> ItemSaver:
    """The job's saver, not yet opened, if ``settings`` allow its class and its output
    (:class:`PluginNotAllowed`, :class:`OutputNotAllowed`)."""
    return _saver_class(spec, settings, {}).from_spec(spec.saver, job=job, worker_id=worker_id)
