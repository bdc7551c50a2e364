"""A small cache keyed by the identity of the objects a result was made from.

Two memos of the planner key on identity rather than equality: the search space of an
instance object (formulations/solve.py, ``space_of``) and the full- and no-recompute terms a
partial recompute mixes (planner/model/terms.py, ``_mixed_terms``). An instance or a set of
degrees holding numpy arrays or symbols has no cheap, exact equality, and the objects that
ask again are the very same ones (the k solves of a top-k list, the shares of one layout).

Keying on ``id()`` is only sound while the object lives: a freed object's id can be reused by
a new one. So each entry holds the objects it was keyed on; an id in the cache is never
reused while the entry is there, and a hit is checked to be the same objects.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


class IdentityCache:
    """Up to ``maxsize`` results keyed by the identity of ``objs`` plus a hashable ``extra``
    key, the least recently used dropped first. Thread-safe (the solver encodes parts in two
    threads); ``make`` runs outside the lock, so two threads missing at once may both make
    the result, and the later one is kept (results are equal: they come from the same
    objects)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._entries: OrderedDict[tuple, tuple[tuple, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, objs: tuple, extra: Hashable, make: Callable[[], Any]) -> Any:
        key = (tuple(id(o) for o in objs), extra)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and all(a is b for a, b in zip(hit[0], objs)):
                self._entries.move_to_end(key)
                return hit[1]
        value = make()
        with self._lock:
            self._entries[key] = (objs, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
