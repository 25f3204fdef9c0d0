"""The package's imports run one way: each sub-package imports only from its own layer and the
layers below it, so the layout stays readable and free of import circles."""

from __future__ import annotations

import ast
from pathlib import Path

import distscrape_celery

PACKAGE = Path(distscrape_celery.__file__).parent
# Lowest first. A module of one layer may import from its own layer and those before it.
# The settings sit above the tracker: they take the tracker's defaults (tracker/defaults.py).
LAYERS = [
    {"errors", "redaction", "caches", "lifecycle", "redis_urls"},
    {"tracker"},
    {"settings"},
    {"job"},
    {"web"},
    {"scrapers", "savers", "extract"},
    {"core"},
    # events: the old import path of worker.events.job_finished, kept for users' hook modules.
    {"worker", "events"},
    {"local"},
    # The job API: over core (the same job control as the commands), below the command that
    # serves it.
    {"api"},
    {"cli"},
    # Tools for trying and testing the crawler (generated sites on loopback): on top, so that
    # nothing of the crawler imports them; they import nothing of it either.
    {"testing"},
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


# The worker's own floors, lowest first, the same rule inside worker/: the names and fixes that
# everything agrees on, then the app (a leaf: its tasks and hooks import it, never the other way
# round), the publisher and the agent, the tasks that use the publisher, the signal hooks that
# wire them into a worker, and the entry point that starts one.
WORKER_LAYERS = [
    {"names", "kombu_fixes", "events", "lost_saves"},
    {"app"},
    {"publish", "agent"},
    {"tasks"},
    {"signals"},
    {"main"},
]
WORKER_RANK = {name: rank for rank, names in enumerate(WORKER_LAYERS) for name in names}


def test_every_worker_module_belongs_to_a_worker_layer():
    names = {p.stem for p in (PACKAGE / "worker").glob("*.py")} - {"__init__"}
    assert names == set(WORKER_RANK), "a module of worker/ is in no worker layer"


def test_worker_modules_never_import_a_higher_worker_module():
    climbs = []
    for path in (PACKAGE / "worker").glob("*.py"):
        if path.stem == "__init__":
            continue
        for line, target in imports_of(path):
            parts = target.split(".")
            if parts[1:2] != ["worker"] or len(parts) < 3:
                continue
            if WORKER_RANK[parts[2]] > WORKER_RANK[path.stem]:
                climbs.append(f"worker/{path.name}:{line} imports {target}")
    assert not climbs, "\n".join(climbs)
