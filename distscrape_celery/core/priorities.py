"""The priorities of the links a page yields, by the job's rule (its spec's ``priority.rule``).

A rule is a function ``(url, depth, parent_url) -> int``: ``depth`` is the link's, one more than
its page's. The tracker dispatches a domain's higher priorities first, equal ones first come,
first served; breadth-first, the default, is no function at all (every link at 0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..tracker.base import PRIORITY_MAX

PriorityRule = Callable[[str, int, str], int]


def depth_first(url: str, depth: int, parent_url: str) -> int:
    """Deeper links first: a link's priority is its depth (at most PRIORITY_MAX)."""
    return min(depth, PRIORITY_MAX)


def link_priorities(rule: PriorityRule, found: Sequence[str], depth: int, parent: str) -> list[int]:
    """The priority ``rule`` gives each of ``found`` (links of ``parent`` at ``depth``), held
    within -PRIORITY_MAX .. PRIORITY_MAX. Raises TypeError for a rule that returns anything but
    an integer."""
    out = []
    for url in found:
        priority = rule(url, depth, parent)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"the priority rule returned {priority!r} for {url}, not an integer")
        out.append(max(-PRIORITY_MAX, min(PRIORITY_MAX, priority)))
    return out
