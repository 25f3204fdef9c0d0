"""Fields by CSS or XPath selectors, as the job's ``[extract]`` names them: one record per page,
or one per repeating block."""

from __future__ import annotations

from typing import Any, Optional

import regex
from parsel import Selector, SelectorList

from ..job.extract_spec import ExtractSpec, FieldSpec
from ..job.patterns import Budget, compile_pattern


class SelectorField:
    """One field, compiled: its selector run on a page or block, its regex on each value."""

    def __init__(self, name: str, spec: FieldSpec) -> None:
        self.name = name
        self.css = spec.css
        self.xpath = spec.xpath
        self.pattern: Optional[regex.Pattern] = (
            compile_pattern(spec.re) if spec.re is not None else None)
        self.all = spec.all

    def value(self, scope: Selector, budget: Budget) -> Any:
        """The field's value in ``scope``: the first value or None, or with ``all`` every value."""
        matched: SelectorList = scope.css(self.css) if self.css is not None else scope.xpath(self.xpath)
        if self.pattern is None:
            return matched.getall() if self.all else matched.get()
        found: list[str] = []
        for value in matched.getall():
            found += self._matches(value, budget)
            if found and not self.all:
                return found[0]  # the first value's first match: no need to read the others
        return found if self.all else None

    def _matches(self, value: str, budget: Budget) -> list[str]:
        """Each match of the field's regex in ``value``: its first group if it has groups."""
        group = 1 if self.pattern.groups else 0  # type: ignore[union-attr]
        return [m.group(group) or "" for m in budget.finditer(self.pattern, value)]  # type: ignore[arg-type]


class SelectorRecords:
    """The records a page's selectors give: one holding every field, or one per block that the
    spec's ``item`` (``item_xpath``) matches, each field's selector run within its block."""

    def __init__(self, spec: ExtractSpec) -> None:
        self.fields = [SelectorField(name, field) for name, field in spec.fields.items()]
        self.item_css = spec.item
        self.item_xpath = spec.item_xpath

    def records(self, selector: Selector, budget: Budget, limit: int) -> list[dict]:
        """At most ``limit`` records of the page ``selector`` holds (only its fields; the page's
        keys are added by the caller)."""
        if not self.fields:
            return []
        if self.item_css is None and self.item_xpath is None:
            return [self._record(selector, budget)]
        blocks = (selector.css(self.item_css) if self.item_css is not None
                  else selector.xpath(self.item_xpath))
        return [self._record(block, budget) for block in blocks[:limit]]

    def _record(self, scope: Selector, budget: Budget) -> dict:
        return {field.name: field.value(scope, budget) for field in self.fields}
