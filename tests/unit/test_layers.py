"""The package's imports run one way: each sub-package imports only from its own layer and the
layers below it, so the layout stays readable and free of import circles."""

from __future__ import annotations

import ast
from pathlib import Path

import distscrape_celery

PACKAGE = Path(distscrape_celery.__file__).parent
# Lowest first. A module of one layer may import from its own layer and those before it.
LAYERS = [
    {"errors", "redaction", "caches", "lifecycle", "redis_urls", "settings"},
    {"tracker"},
    {"job"},
    {"web"},
    {"scrapers", "savers"},
    {"core"},
    # events: the old import path of worker.events.job_finished, kept for users' hook modules.
    {"worker", "events"},
    {"local"},
    {"cli"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def top_name(module: str) -> str:
    """The part of ``distscrape_celery.a.b`` that names a layer (``a``)."""
    return module.split(".")[1] if module.count(".") else ""


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of the package in ``path``."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts if parts[-1] == "__init__" else parts[:-1]
    if parts[-1] == "__init__":
        package = parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
                names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""]
            found += [(node.lineno, n) for n in names if n.startswith("distscrape_celery.")]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.startswith("distscrape_celery.")]
    return found


def test_every_module_belongs_to_a_layer():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.name != "__init__.py"}
    assert names - {"__pycache__"} == set(RANK), "a module or sub-package is in no layer"


def test_imports_never_climb_to_a_higher_layer():
    climbs = []
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own == "__init__":
            continue  # the package's root only names the Celery app, on first access
        for line, target in imports_of(path):
            layer = top_name(target)
            if layer and RANK[layer] > RANK[own]:
                climbs.append(f"{path.relative_to(PACKAGE)}:{line} imports {target}")
    assert not climbs, "\n".join(climbs)
