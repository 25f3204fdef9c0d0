"""The job's own regexes (link_regex, allow_regex, deny_regex, id_regex), run by the ``regex``
package under a time budget per page: a pattern that backtracks catastrophically (``(\\w|\\w\\w)+$``
on a run of letters) ends the page's extraction instead of holding a worker thread for hours,
which ``re`` cannot prevent."""

from __future__ import annotations

import time
from collections.abc import Iterator

import regex

# The default of scraper.regex_seconds: a page's worth of ordinary patterns takes milliseconds.
DEFAULT_REGEX_SECONDS = 2.0


class PatternTimeout(Exception):
    """A page's pattern matching used up its time budget."""


def compile_pattern(pattern: str) -> regex.Pattern:
    """``pattern`` compiled as the job's matching runs it. Raises ``ValueError`` naming the
    problem when it does not compile."""
    try:
        return regex.compile(pattern)
    except regex.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from None


class Budget:
    """The time one page's pattern matching may take, counted from the budget's creation; every
    match given it raises :class:`PatternTimeout` once the time is used up."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._deadline = time.monotonic() + seconds

    def _left(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise self._timeout()
        return left

    def _timeout(self) -> PatternTimeout:
        return PatternTimeout(f"its regexes took more than {self.seconds:g} s")

    def search(self, pattern: regex.Pattern, text: str) -> bool:
        """Whether ``pattern`` matches somewhere in ``text``."""
        try:
            return pattern.search(text, timeout=self._left()) is not None
        except TimeoutError:
            raise self._timeout() from None

    def finditer(self, pattern: regex.Pattern, text: str) -> Iterator[regex.Match]:
        """The matches of ``pattern`` in ``text``, in order; the budget covers the whole scan."""
        try:
            yield from pattern.finditer(text, timeout=self._left())
        except TimeoutError:
            raise self._timeout() from None
