"""Belady's offline optimum (MIN): evict the key whose next use is furthest in the future.

It needs the future, so it exists to measure the online policies, not to serve. Build it
with the whole access sequence, one key per access, in the order the accesses happen:

    policy = Belady(capacity, future=[k0, k1, k2, ...])

It advances by counting uses: the ``i``-th use of a key (an ``on_insert`` after a miss, or
an ``on_access`` on a hit, i.e. ``prepare_load`` or ``touch``) is taken to be that key's
``i``-th occurrence in ``future``, so its next use is its ``(i + 1)``-th occurrence (never,
past the last). Within one request the store may report hits before misses; counting per
key makes that order irrelevant. An access the store never reports (a miss that was not
stored, a hit that was neither loaded nor touched) must be reported with ``skip(key)``,
else that key's next use is read one occurrence early. Keys not in ``future`` are never
used again and go first.

>>> b = Belady(2, future=["a", "b", "c", "a"])
>>> b.on_insert(["a", "b"])
>>> b.victims(1)   # at "c": a is used again at 3, b never
['b']
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Hashable, Iterator, Sequence

from kvtier.store.policies.base import Keys, Policy

NEVER = 2**62
"""Next-use position of a key that is not used again."""


class Belady(Policy):
    """The offline optimum over ``capacity`` slots, given the future accesses."""

    name = "belady"

    def __init__(self, capacity: int, future: Sequence[Hashable] = ()) -> None:
        super().__init__(capacity)
        self._occurrences: dict[Hashable, list[int]] = {}
        for position, key in enumerate(future):
            self._occurrences.setdefault(key, []).append(position)
        self._uses: dict[Hashable, int] = {}
        self._next_use: dict[Hashable, int] = {}
        # max-heap of (-next_use, tiebreak, key); entries go stale when a key is used again
        self._heap: list[tuple[int, int, Hashable]] = []
        self._tiebreak = itertools.count()

    def _use(self, keys: Keys) -> None:
        uses, occ, next_use, heap, tiebreak = (
            self._uses, self._occurrences, self._next_use, self._heap, self._tiebreak,
        )
        for key in keys:
            i = uses.get(key, 0) + 1
            uses[key] = i
            occurrences = occ.get(key, ())
            nxt = occurrences[i] if i < len(occurrences) else NEVER
            next_use[key] = nxt
            heapq.heappush(heap, (-nxt, next(tiebreak), key))
        if len(heap) > 2 * len(next_use) + 64:
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        self._heap = [(-n, next(self._tiebreak), k) for k, n in self._next_use.items()]
        heapq.heapify(self._heap)

    def on_insert(self, keys: Keys) -> None:
        self._use(keys)

    def on_access(self, keys: Keys) -> None:
        self._use(keys)

    def skip(self, key: Hashable) -> None:
        """Count an access to ``key`` that the store did not report (see the module doc)."""
        self._uses[key] = self._uses.get(key, 0) + 1

    def next_use(self, key: Hashable) -> int | None:
        """Position in ``future`` of a resident key's next use (``NEVER`` if none)."""
        return self._next_use.get(key)

    def on_remove(self, keys: Keys) -> None:
        for key in keys:
            del self._next_use[key]

    def __len__(self) -> int:
        return len(self._next_use)

    def __contains__(self, key: object) -> bool:
        return key in self._next_use

    def resident(self) -> Iterator[Hashable]:
        return iter(self._next_use)

    def _select(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        chosen: list[Hashable] = []
        passed_over = []
        while len(chosen) < n:
            entry = heapq.heappop(self._heap)
            key = entry[2]
            if self._next_use.get(key) != -entry[0]:
                continue  # stale: evicted, removed, or used again since
            if key in protected:
                passed_over.append(entry)
                continue
            del self._next_use[key]
            chosen.append(key)
        for entry in passed_over:
            heapq.heappush(self._heap, entry)
        return chosen
