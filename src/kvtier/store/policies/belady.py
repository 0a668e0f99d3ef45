"""Belady's offline optimum (MIN): evict the key whose next use is furthest in the future.

It needs the future, so it exists to measure the online policies, not to serve. Build it
with the whole access sequence, one key per access, in the order the accesses happen:

    policy = Belady(capacity, future=[k0, k1, k2, ...])

It advances by counting uses: the ``i``-th use of a key (an ``on_insert`` after a miss, or
an ``on_access`` on a hit, i.e. ``complete_load`` or ``touch``) is taken to be that key's
``i``-th occurrence in ``future``, so its next use is its ``(i + 1)``-th occurrence (never,
past the last). Within one request the store may report hits before misses; counting per
key makes that order irrelevant. An access the store never reports (a miss that was not
stored, a hit that was neither loaded nor touched) must be reported with ``skip(key)``,
else that key's next use is read one occurrence early. Keys not in ``future`` are never
used again and go first.

Storage: ``FutureIndex``, each key's positions in ``future`` in an ``array`` of 8-byte
ints (not the sequence itself: a replay builds it by streaming its trace once, ``add``);
each use counted per key. The heap of candidates holds ``(-next use, key)`` of resident
keys (a min-heap gives the furthest first); an entry is stale when that key's next use has
moved on. Keys never used again wait in their own FIFO.

>>> b = Belady(2, future=["a", "b", "c", "a"])
>>> b.on_insert(["a", "b"])
>>> b.victims(1)   # at "c": a is used again at 3, b never
['b']
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence
from typing import Final

from mypy_extensions import mypyc_attr

from kvtier.store.policies.base import Keys, Policy

NEVER: Final = 2**62
"""Next-use position of a key that is not used again."""


class FutureIndex:
    """Where each key occurs in an access sequence, added in order: ``positions[key]`` is
    an ``array('q')`` of its positions (8 bytes an access, plus one entry a key).

    >>> f = FutureIndex.of(["a", "b", "a"]); list(f.positions["a"]), len(f), f.num_keys()
    ([0, 2], 3, 2)
    """

    __slots__ = ("_length", "positions")

    def __init__(self) -> None:
        self.positions: dict[Hashable, array[int]] = {}
        self._length = 0

    @classmethod
    def of(cls, future: Iterable[Hashable]) -> FutureIndex:
        index = cls()
        index.add(future)
        return index

    def add(self, keys: Iterable[Hashable]) -> None:
        """The next accesses, in order."""
        positions, n = self.positions, self._length
        for key in keys:
            found = positions.get(key)
            if found is None:
                found = positions[key] = array("q")
            found.append(n)
            n += 1
        self._length = n

    def __len__(self) -> int:
        return self._length

    def num_keys(self) -> int:
        return len(self.positions)


@mypyc_attr(allow_interpreted_subclasses=True)
class Belady(Policy):
    """The offline optimum over ``capacity`` slots, given the future accesses (a sequence
    of keys, or their ``FutureIndex``)."""

    name = "belady"

    def __init__(
        self, capacity: int, future: Sequence[Hashable] | FutureIndex = ()
    ) -> None:
        super().__init__(capacity)
        index = future if isinstance(future, FutureIndex) else FutureIndex.of(future)
        self._occurrences = index.positions  # shared, read only: uses are counted here
        self._uses: dict[Hashable, int] = {}  # key -> uses counted so far
        self._next_use: dict[Hashable, int] = {}
        self._heap: list[tuple[int, Hashable]] = []  # (-next_use, key) of resident keys
        self._never: deque[Hashable] = deque()  # keys not used again, oldest first; stale too

    def _use(self, keys: Keys) -> None:
        occ, uses, next_use, heap = self._occurrences, self._uses, self._next_use, self._heap
        never, push = self._never, heapq.heappush
        for key in keys:
            positions = occ.get(key)
            if positions is None:  # not in the future at all
                next_use[key] = NEVER
                never.append(key)
                continue
            i = uses[key] = uses.get(key, 0) + 1  # its i-th use; next, the (i+1)-th
            if i < len(positions):
                nxt = next_use[key] = positions[i]
                push(heap, (-nxt, key))
            else:
                next_use[key] = NEVER
                never.append(key)
        if len(heap) + len(never) > 3 * len(next_use) + 64:  # an offline yardstick: time first
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop stale entries: one heap entry per key used again, one FIFO entry per other."""
        self._heap = [(-n, k) for k, n in self._next_use.items() if n != NEVER]
        heapq.heapify(self._heap)
        next_use = self._next_use
        self._never = deque(k for k in dict.fromkeys(self._never) if next_use.get(k) == NEVER)

    def on_insert(self, keys: Keys) -> None:
        self._use(keys)

    def on_access(self, keys: Keys) -> None:
        self._use(keys)

    def skip(self, key: Hashable) -> None:
        """Count an access to ``key`` that the store did not report (see the module doc)."""
        if key in self._occurrences:
            self._uses[key] = self._uses.get(key, 0) + 1

    def uncount(self, key: Hashable) -> None:
        """Take back one counted use of ``key`` (its next use then rereads the same
        occurrence): for a caller that reported a use it should not have counted."""
        if self._uses.get(key):
            self._uses[key] -= 1

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
        next_use, never = self._next_use, self._never
        chosen: list[Hashable] = []
        passed: list[Hashable] = []
        while never and len(chosen) < n:  # keys not used again go first, oldest first
            key = never.popleft()
            if next_use.get(key) != NEVER:
                continue  # stale: evicted, removed, or (a skip) used again since
            if protected and key in protected:
                passed.append(key)
                continue
            del next_use[key]
            chosen.append(key)
        never.extend(passed)
        if len(chosen) < n:
            chosen += self._select_furthest(n - len(chosen), protected)
        return chosen

    def _select_furthest(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        """The ``n`` unprotected keys whose next use is furthest (all are used again)."""
        next_use, heap, pop = self._next_use, self._heap, heapq.heappop
        chosen: list[Hashable] = []
        passed: list[tuple[int, Hashable]] = []
        while len(chosen) < n:
            entry = pop(heap)
            neg, key = entry
            if next_use.get(key) != -neg:
                continue  # stale: evicted, removed, or used again since
            if protected and key in protected:
                passed.append(entry)
                continue
            del next_use[key]
            chosen.append(key)
        for entry in passed:
            heapq.heappush(heap, entry)
        return chosen
