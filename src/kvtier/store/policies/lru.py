"""Least recently used: evict the chunk whose last insert or access is oldest.

Protected keys met while choosing victims move to the new end, as if just used.

>>> lru = LRU(2)
>>> lru.on_insert(["a", "b"]); lru.on_access(["a"])
>>> lru.victims(1)
['b']
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterator

from mypy_extensions import mypyc_attr

from kvtier.store.policies.base import Keys, Policy
from kvtier.store.policies.queue import recency_order


@mypyc_attr(allow_interpreted_subclasses=True)
class LRU(Policy):
    """One queue in recency order, oldest first."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order = recency_order()

    def on_insert(self, keys: Keys) -> None:
        self._order.push(keys)

    def on_access(self, keys: Keys) -> None:
        self._order.to_new_end(keys)

    def on_remove(self, keys: Keys) -> None:
        for k in keys:
            self._order.remove(k)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def resident(self) -> Iterator[Hashable]:
        return iter(self._order)

    def _select(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        return self._order.pop_unprotected(n, protected)
