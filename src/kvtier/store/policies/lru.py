"""Least recently used: evict the chunk whose last insert or access is oldest.

Protected keys met while choosing victims move to the new end, as if just used.

The order is an ``OrderedDict`` (its C linked list: a move or a pop is one call, with no
stale entries to skip later), not a ``KeyQueue``: LRU keeps one entry per resident chunk and
no ghosts, so the larger entry (about 140 bytes) still fits the store's 256-byte budget,
and it is several times cheaper per access than the queue's append-and-compact.

>>> lru = LRU(2)
>>> lru.on_insert(["a", "b"]); lru.on_access(["a"])
>>> lru.victims(1)
['b']
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable, Iterator
from itertools import repeat

from kvtier.store.policies.base import Keys, Policy


class LRU(Policy):
    """One ordered dict in recency order, oldest first (values unused)."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[Hashable, None] = OrderedDict()

    def on_insert(self, keys: Keys) -> None:
        self._order.update(zip(keys, repeat(None)))

    def on_access(self, keys: Keys) -> None:
        move = self._order.move_to_end
        for k in keys:
            move(k)

    def on_remove(self, keys: Keys) -> None:
        for k in keys:
            del self._order[k]

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def resident(self) -> Iterator[Hashable]:
        return iter(self._order)

    def _select(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        pop = self._order.popitem
        if not protected:  # n pops from the old end, at C speed
            return [k for k, _ in map(pop, repeat(False, n))]
        chosen: list[Hashable] = []
        passed: list[Hashable] = []
        while len(chosen) < n:
            k, _ = pop(False)
            (passed if k in protected else chosen).append(k)
        self._order.update(zip(passed, repeat(None)))
        return chosen
