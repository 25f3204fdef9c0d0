"""Helpers shared by the tests and the benchmarks: generated sites, HTTP servers on loopback,
crawl and pipeline set-ups, the command line as a subprocess. Fixtures are in
tests/conftest.py, but for those only a few files use (``robots.store``), which they import."""

from pathlib import Path

# The repository's root, for the tests that read its files (docs, config, deployment files) or
# start processes in it, wherever the test file itself lies.
REPO_ROOT = Path(__file__).resolve().parents[2]
