"""Building the scraper and saver a job's spec names.

Each kind maps to a dotted path, so adding an implementation is one line here. A spec may also
name a class of its own as ``module:Class``; since a spec comes from whoever can write to the
tracker's Redis, a process imports such a module only if its own settings allow it
(``plugin_modules``), and a file-writing saver writes only under the settings' ``output_roots``
(unset, a worker writes no path at all), and never where Python would import or run what it wrote.
"""

from __future__ import annotations

import importlib
import os
import site
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional

from ..errors import ConfigError, OutputNotAllowed, PluginNotAllowed
from ..job.sections import PRIORITY_RULES
from ..job.spec import JobSpec
from .priorities import PriorityRule, depth_first
from ..savers import ItemSaver
from ..savers.files import FileItemSaver
from ..savers.shards import ShardedItemSaver
from ..scrapers import Scraper
from ..settings import ENV_PREFIX, Settings, is_dotted_name
from ..web.fetch_policy import check_policy_settings

SCRAPERS = {
    "simple": "distscrape_celery.scrapers:SimpleScraper",
    "ids": "distscrape_celery.scrapers:IDScraper",
}
SAVERS = {
    "files": "distscrape_celery.savers:FileItemSaver",
    "redis": "distscrape_celery.savers:RedisItemSaver",
    "tar": "distscrape_celery.savers:TarItemSaver",
    "warc": "distscrape_celery.savers:WarcItemSaver",
    "postgres": "distscrape_celery.savers.postgres:PostgresItemSaver",
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
        loaded = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {path!r}: {exc}") from None
    if not (isinstance(loaded, type) and issubclass(loaded, base)):
        raise ConfigError(
            f"{path!r} is not a subclass of {base.__name__} (which must implement "
            f"{', '.join(sorted(getattr(base, '__abstractmethods__', ())))})"
        )
    return loaded


def load_function(path: str, settings: Settings) -> Callable[..., Any]:
    """Import the function ``module:function``, if ``settings`` allow its module (checked
    first), and check that it can be called."""
    check_plugin(path, settings)
    module_name, _, attr = path.partition(":")
    try:
        loaded = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {path!r}: {exc}") from None
    if isinstance(loaded, type) or not callable(loaded):
        raise ConfigError(f"{path!r} is not a function")
    return loaded


def check_output(output: str, settings: Settings, *, roots_required: bool = True) -> None:
    """Raise :class:`OutputNotAllowed` unless the path ``output`` may be written by this process.

    It must lie under one of ``settings.output_roots`` once resolved (symlinks followed,
    relative to this process's directory). Unset roots refuse every path when
    ``roots_required`` (a worker: a spec comes from whoever can write to Redis) and allow every
    path otherwise (a seeding process, which writes nothing itself). An allowed path must also
    keep clear of the directories Python imports from (:func:`check_not_importable`)."""
    roots = settings.output_roots
    if roots is None:
        if roots_required:
            raise OutputNotAllowed(
                f"{output!r}: this process's {ENV_PREFIX}OUTPUT_ROOTS is unset, and a worker "
                "writes a files, tar or warc output only under the directories it names "
                f"(set {ENV_PREFIX}OUTPUT_ROOTS on the workers, e.g. /data)"
            )
        return
    real = os.path.realpath(output)
    admitting = [r for r in map(os.path.realpath, roots) if _is_within(real, r)]
    if not admitting:
        resolved = f" (resolved: {real!r})" if real != output else ""
        raise OutputNotAllowed(
            f"{output!r}{resolved} is not under this process's {ENV_PREFIX}OUTPUT_ROOTS "
            f"({', '.join(roots)})"
        )
    check_not_importable(output, real, admitting)


def import_directories() -> tuple[list[str], list[str]]:
    """(site directories, other import directories) of this interpreter, resolved.

    Site directories are ``site.getsitepackages()`` and ``site.getusersitepackages()``, whether
    they exist or not (a user site made by a saver would be read at the next start, unless
    PYTHONNOUSERSITE is set): the interpreter runs their ``.pth`` files and imports installed
    packages from them. The others are every ``sys.path`` entry that is not a file (a zip), the
    empty entry being the working directory."""
    user_site = site.getusersitepackages()
    sites = [*site.getsitepackages(), *([user_site] if isinstance(user_site, str) else [])]
    others = [entry or os.getcwd() for entry in sys.path if not os.path.isfile(entry or ".")]
    resolved_sites = list(dict.fromkeys(os.path.realpath(p) for p in sites))
    return resolved_sites, [p for p in dict.fromkeys(map(os.path.realpath, others))
                            if p not in resolved_sites]


def check_not_importable(output: str, real: str, roots: Iterable[str]) -> None:
    """Raise :class:`OutputNotAllowed` if what a saver writes under ``real`` (``output``
    resolved, allowed by the resolved ``roots``) could be imported or run by Python here.

    Refused: an output that is an import directory or an ancestor of one (its files could be
    ``.pth`` files or modules there); one under a site directory; and one under another import
    directory whose first part below it is a name Python could import (a package), unless one
    of ``roots`` lies strictly below that directory (then the operator, not the spec, chose that
    name: a crawl's output inside a source checkout, say)."""
    sites, others = import_directories()
    for directory in (*sites, *others):
        if _is_within(directory, real):
            raise OutputNotAllowed(
                f"{output!r} is or contains the Python import directory {directory!r}: files "
                f"written there could be run by Python, so no {ENV_PREFIX}OUTPUT_ROOTS allows it"
            )
    for directory in sites:
        if _is_within(real, directory):
            raise OutputNotAllowed(
                f"{output!r} lies under the Python site directory {directory!r}: files written "
                f"there could be run by Python, so no {ENV_PREFIX}OUTPUT_ROOTS allows it"
            )
    for directory in others:
        if not _is_within(real, directory):
            continue
        name = os.path.relpath(real, directory).split(os.sep, 1)[0]
        chosen = any(_is_within(root, directory) and root != directory for root in roots)
        if name.isidentifier() and not chosen:
            raise OutputNotAllowed(
                f"{output!r} lies under the Python import directory {directory!r}, where files "
                f"written under {name!r} could be imported as the package {name!r}, so "
                f"{ENV_PREFIX}OUTPUT_ROOTS allows it only as a root of its own"
            )


def _is_within(path: str, directory: str) -> bool:
    """Whether the resolved ``path`` is ``directory`` or lies under it (both absolute)."""
    return os.path.commonpath([directory, path]) == directory


def _component(field: str, kind: str, builtin: Mapping[str, str], base: type,
               settings: Settings, names: Mapping[str, str]) -> type:
    """The class ``kind`` names, for the spec's ``field``; an error names the field as
    ``names`` calls it."""
    try:
        return load_class(builtin.get(kind, kind), base, settings)
    except ConfigError as exc:
        raise type(exc)(f"{names.get(field, field)}: {exc}") from None


def _saver_class(spec: JobSpec, settings: Settings, names: Mapping[str, str], *,
                 worker: bool) -> type:
    """The saver class of ``spec``, its output checked against ``settings.output_roots``: as a
    ``worker`` writing it (roots required, an absolute path only), or as the process seeding it
    (see :func:`check_output`)."""
    saver_class = _component("saver.kind", spec.saver.kind, SAVERS, ItemSaver, settings, names)
    if issubclass(saver_class, PATH_SAVERS):
        try:
            if worker and settings.output_roots is not None and not os.path.isabs(
                    spec.saver.output):
                # Resolved against each worker's own directory (or, for "~", not expanded at
                # all), it would name a different place on every host: never what was meant.
                raise OutputNotAllowed(
                    f"{spec.saver.output!r} is not an absolute path, which a worker resolves "
                    f"neither against its own directory nor its home, so {ENV_PREFIX}OUTPUT_ROOTS "
                    "cannot allow it (distscrape seed makes every output absolute)"
                )
            check_output(spec.saver.output, settings, roots_required=worker)
        except OutputNotAllowed as exc:
            raise OutputNotAllowed(f"{names.get('saver.output', 'saver.output')}: {exc}") from None
    return saver_class


def check_components(
    spec: JobSpec, settings: Settings, names: Optional[Mapping[str, str]] = None
) -> None:
    """Check that the scraper and saver ``spec`` names can be loaded by this process (the
    seeding one) under its ``settings``, so a bad or refused dotted path, or an output outside
    the allowed roots, is a clear error at seed time, not one dead item after another. With no
    ``output_roots`` here, any output passes (the workers' own roots decide); likewise a proxy
    the spec names is checked only against this process's own ``proxies``. The error names
    the field as ``names`` calls it (``scraper.kind`` -> ``--scraper``)."""
    _component("scraper.kind", spec.scraper.kind, SCRAPERS, Scraper, settings, names or {})
    _saver_class(spec, settings, names or {}, worker=False)
    build_priority_rule(spec, settings, names or {})
    check_policy_settings(spec, settings, own_workers=False)


def writes_paths(spec: JobSpec, settings: Settings) -> bool:
    """Whether the saver ``spec`` names writes a path on each worker's host (files, tar, warc,
    or a subclass), which the workers' ``output_roots`` must then allow."""
    saver_class = _component("saver.kind", spec.saver.kind, SAVERS, ItemSaver, settings, {})
    return issubclass(saver_class, PATH_SAVERS)


def spec_plugin_modules(spec: JobSpec) -> tuple[str, ...]:
    """The modules of the classes ``spec`` names that are not built in (well-formed names
    only: :func:`check_plugin` refuses the others)."""
    paths = (SCRAPERS.get(spec.scraper.kind, spec.scraper.kind),
             SAVERS.get(spec.saver.kind, spec.saver.kind),
             *([] if spec.priority.rule in PRIORITY_RULES else [spec.priority.rule]))
    modules = (p.partition(":")[0] for p in paths if p not in BUILTIN_PATHS)
    return tuple(dict.fromkeys(m for m in modules if is_dotted_name(m)))


def build_scraper(spec: JobSpec, settings: Settings) -> Scraper:
    """The job's scraper, if ``settings`` allow its class (:class:`PluginNotAllowed`)."""
    return _component(
        "scraper.kind", spec.scraper.kind, SCRAPERS, Scraper, settings, {}
    ).from_spec(spec)


def build_saver(spec: JobSpec, job: str, worker_id: str, settings: Settings) -> ItemSaver:
    """The job's saver, not yet opened, if ``settings`` allow its class and its output
    (:class:`PluginNotAllowed`, :class:`OutputNotAllowed`: for a path, roots must be set)."""
    return _saver_class(spec, settings, {}, worker=True).for_worker(
        spec.saver, job=job, worker_id=worker_id, settings=settings)


def build_priority_rule(
    spec: JobSpec, settings: Settings, names: Optional[Mapping[str, str]] = None
) -> Optional[PriorityRule]:
    """The job's priority rule for found links (None: breadth-first, every link at 0), its
    function loaded if ``settings`` allow its module (:class:`PluginNotAllowed`)."""
    rule = spec.priority.rule
    if rule == "breadth-first":
        return None
    if rule == "depth-first":
        return depth_first
    try:
        return load_function(rule, settings)
    except ConfigError as exc:
        field = (names or {}).get("priority.rule", "priority.rule")
        raise type(exc)(f"{field}: {exc}") from None
