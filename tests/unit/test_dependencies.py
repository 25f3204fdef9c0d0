"""Every package the crawler imports is one pyproject.toml installs: a fresh install (CI's, a
user's) must not need anything a developer's virtualenv happened to have."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

import distscrape_celery

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from packaging.requirements import Requirement

PACKAGE = Path(distscrape_celery.__file__).parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_names() -> dict[str, str]:
    """Each top-level module outside the standard library that the package imports, with one
    file that imports it."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top != PACKAGE.name:
                    found.setdefault(top, str(path.relative_to(PACKAGE.parent)))
    return found


def test_every_imported_package_is_a_declared_dependency():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    # An extra's packages (psycopg, for the postgres saver) are imported only by what needs them.
    extras = [r for name, reqs in project.get("optional-dependencies", {}).items()
              if name != "test" for r in reqs]
    declared = [Requirement(r) for r in [*project["dependencies"], *extras]]
    allowed = {normal(r.name) for r in declared}
    # What a declared dependency itself requires is installed with it (kombu with celery).
    for requirement in declared:
        try:
            allowed |= {normal(Requirement(r).name) for r in metadata.requires(requirement.name) or ()}
        except metadata.PackageNotFoundError:  # a dependency for another Python (tomli)
            pass
    distributions = metadata.packages_distributions()
    missing = {top: where for top, where in imported_top_names().items()
               if not {normal(d) for d in distributions.get(top, [top])} & allowed}
    assert not missing, f"imported but not in pyproject.toml's dependencies: {missing}"
