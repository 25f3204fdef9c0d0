"""Per-process caches bounded by the memory they hold, not by their number of entries: what a
page links to decides how large each entry is, and a hostile page picks that."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# What an entry costs besides its key and value: its slots in the two dicts and its size
# (measured with tracemalloc: about 160 bytes).
ENTRY_OVERHEAD = 200


def text_bytes(*parts: str) -> int:
    """The memory these strings take (CPython's own size of each, header included)."""
    return sum(map(sys.getsizeof, parts))


class ByteBoundedCache(Generic[K, V]):
    """A thread-safe map that holds at most ``max_bytes``, each entry reckoned as
    ``size_of(key, value)`` plus a fixed overhead; when full, the oldest entries go first. An
    entry larger than the whole budget is not kept.

    ``get(key, default=None)``, the value kept for ``key``, is a dict's own method, without a
    lock: it is paid once per link of every page, and cachetools' LRUCache (Python code and a
    lock on each hit) made a page's links three times as slow to resolve. Oldest-first is enough
    for links, which repeat on every page of a site or not at all."""

    def __init__(self, max_bytes: int, size_of: Callable[[K, V], int]) -> None:
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._values: dict[K, V] = {}
        self._sizes: OrderedDict[K, int] = OrderedDict()  # oldest first
        self._bytes = 0
        self._lock = threading.Lock()  # for writers: a read is atomic under the GIL
        self.get: Callable[..., Any] = self._values.get

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` for ``key``, dropping the oldest entries to make room."""
        size = ENTRY_OVERHEAD + self._size_of(key, value)
        if size > self.max_bytes:
            return
        with self._lock:
            self._bytes -= self._sizes.pop(key, 0)
            while self._bytes + size > self.max_bytes:
                oldest, dropped = self._sizes.popitem(last=False)
                del self._values[oldest]
                self._bytes -= dropped
            self._values[key] = value
            self._sizes[key] = size
            self._bytes += size

    @property
    def bytes(self) -> int:
        """The memory the entries are reckoned to take now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._values)
