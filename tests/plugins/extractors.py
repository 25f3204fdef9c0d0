"""Extract functions of a job spec's own ([extract] function = "tests.plugins.extractors:..."),
for the tests of records."""

from __future__ import annotations


def headings(page):
    """One record per <h1> or <h2>: its level and text."""
    return [{"level": node.root.tag, "text": node.xpath("string()").get()}
            for node in page.selector.css("h1, h2")]


def broken(page):
    raise RuntimeError("this function fails on every page")


def not_dicts(page):
    return ["a string, not a record"]


not_a_function = 3
