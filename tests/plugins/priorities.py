"""A priority rule of a job spec's own (priority.rule = "tests.plugins.priorities:shallow_path"),
for the tests of priority rules."""

from __future__ import annotations


def shallow_path(url: str, depth: int, parent_url: str) -> int:
    """Links with fewer path segments first; a link under /late/ last of all."""
    if "/late/" in url:
        return -5000  # out of bounds: held to the lowest priority
    return 10 - url.count("/")


not_a_function = 3
