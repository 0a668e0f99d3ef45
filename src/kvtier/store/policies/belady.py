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

Storage: a next use is a position in ``future``, and each position holds one key, so the
heap of candidates is a heap of plain ints (``-position``: a min-heap gives the furthest
first) and a popped position names its key, ``future[position]``; an entry is stale when
that key's next use has moved on. Keys never used again wait in their own FIFO.

>>> b = Belady(2, future=["a", "b", "c", "a"])
>>> b.on_insert(["a", "b"])
>>> b.victims(1)   # at "c": a is used again at 3, b never
['b']
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Collection, Hashable, Iterator, Sequence

from mypy_extensions import mypyc_attr

from kvtier.store.policies.base import Keys, Policy

NEVER = 2**62
"""Next-use position of a key that is not used again."""


@mypyc_attr(allow_interpreted_subclasses=True)
class Belady(Policy):
    """The offline optimum over ``capacity`` slots, given the future accesses."""

    name = "belady"

    def __init__(self, capacity: int, future: Sequence[Hashable] = ()) -> None:
        super().__init__(capacity)
        self._future = list(future)
        # key -> [uses so far, then the positions of its occurrences]: one lookup a use
        self._occurrences: dict[Hashable, list[int]] = {}
        for position, key in enumerate(self._future):
            self._occurrences.setdefault(key, [0]).append(position)
        self._next_use: dict[Hashable, int] = {}
        self._heap: list[int] = []  # -next_use of resident keys used again; stale entries too
        self._never: deque[Hashable] = deque()  # keys not used again, oldest first; stale too

    def _use(self, keys: Keys) -> None:
        occ, next_use, heap, never = self._occurrences, self._next_use, self._heap, self._never
        push = heapq.heappush
        for key in keys:
            occurrences = occ.get(key)
            if occurrences is None:  # not in the future at all
                next_use[key] = NEVER
                never.append(key)
                continue
            i = occurrences[0] = occurrences[0] + 1  # this is its i-th use; next, the (i+1)-th
            if i + 1 < len(occurrences):
                nxt = next_use[key] = occurrences[i + 1]
                push(heap, -nxt)
            else:
                next_use[key] = NEVER
                never.append(key)
        if len(heap) + len(never) > 3 * len(next_use) + 64:  # an offline yardstick: time first
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop stale entries: one heap entry per key used again, one FIFO entry per other."""
        self._heap = [-n for n in self._next_use.values() if n != NEVER]
        heapq.heapify(self._heap)
        next_use = self._next_use
        self._never = deque(k for k in dict.fromkeys(self._never) if next_use.get(k) == NEVER)

    def on_insert(self, keys: Keys) -> None:
        self._use(keys)

    def on_access(self, keys: Keys) -> None:
        self._use(keys)

    def skip(self, key: Hashable) -> None:
        """Count an access to ``key`` that the store did not report (see the module doc)."""
        occurrences = self._occurrences.get(key)
        if occurrences is not None:
            occurrences[0] += 1

    def uncount(self, key: Hashable) -> None:
        """Take back one counted use of ``key`` (its next use then rereads the same
        occurrence): for a caller that reported a use it should not have counted."""
        occurrences = self._occurrences.get(key)
        if occurrences is not None and occurrences[0]:
            occurrences[0] -= 1

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
        next_use, heap, future, pop = self._next_use, self._heap, self._future, heapq.heappop
        chosen: list[Hashable] = []
        passed: list[int] = []
        while len(chosen) < n:
            entry = pop(heap)
            key = future[-entry]
            if next_use.get(key) != -entry:
                continue  # stale: evicted, removed, or used again since
            if protected and key in protected:
                passed.append(entry)
                continue
            del next_use[key]
            chosen.append(key)
        for entry in passed:
            heapq.heappush(heap, entry)
        return chosen
