"""Python memory a piece of work leaves held."""

from __future__ import annotations

import gc
import tracemalloc


def retained_after(work) -> int:
    """Bytes of Python memory still held once ``work()`` has returned (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
