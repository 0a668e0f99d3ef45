"""ARC, the adaptive replacement cache (Megiddo and Modha, FAST 2003).

Four ordered lists, oldest first: ``T1`` (resident, seen once), ``T2`` (resident, seen
twice or more), and their ghosts ``B1`` and ``B2`` (keys recently evicted from ``T1`` and
``T2``, without data). ``p`` is the adaptive target size of ``T1``: a miss that hits ``B1``
means ``T1`` was too small and grows ``p``; a hit in ``B2`` shrinks it. A victim comes from
``T1`` while ``|T1| > p``, else from ``T2``.

Adapted to the paired protocol in one way: the store asks for victims *before* it inserts
the missing key, so ``p`` adapts when the key is inserted (``on_insert``), after the
victims were chosen with the previous ``p``; and the textbook tie-break on ``x in B2`` is
dropped because the incoming key is not known when victims are chosen. Protected keys
met while choosing a victim move to the new end of their list, as if just used.

Worked example, capacity 2: insert a, b (both in T1); access a (a moves to T2); insert c
evicts b (T1's oldest, since ``|T1| = 1 > p = 0``) into B1; inserting b again is a ghost
hit: ``p`` becomes 1 and b goes to T2.

>>> arc = ARC(2)
>>> arc.on_insert(["a", "b"]); arc.on_access(["a"])
>>> arc.victims(1)
['b']
>>> arc.on_insert(["c"]); arc.victims(1); arc.on_insert(["b"]); arc.p
['c']
1.0
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterator

from kvtier.store.policies.base import Keys, Policy, count_in
from kvtier.store.policies.queue import KeyQueue


class ARC(Policy):
    """Adaptive replacement over ``capacity`` slots (see the module docstring)."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = 0.0
        """Target size of ``T1``, in ``[0, capacity]``."""
        self._t1, self._t2 = KeyQueue(), KeyQueue()
        self._b1, self._b2 = KeyQueue(), KeyQueue()

    def on_insert(self, keys: Keys) -> None:
        for k in keys:
            self._insert(k)

    def _insert(self, key: Hashable) -> None:
        b1, b2 = self._b1, self._b2
        if key in b1:
            self.p = min(float(self.capacity), self.p + max(len(b2) / len(b1), 1.0))
            b1.remove(key)
            self._t2.push((key,))
        elif key in b2:
            self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
            b2.remove(key)
            self._t2.push((key,))
        else:
            self._trim_ghosts()
            self._t1.push((key,))

    def _trim_ghosts(self) -> None:
        """Keep ``|T1| + |B1| <= c`` and ``|T1| + |T2| + |B1| + |B2| <= 2c`` after an insert."""
        c = self.capacity
        if len(self._t1) + len(self._b1) >= c:
            if self._b1:
                self._b1.pop_oldest()
        elif len(self) + len(self._b1) + len(self._b2) >= 2 * c and self._b2:
            self._b2.pop_oldest()

    def on_access(self, keys: Keys) -> None:
        t1, t2 = self._t1, self._t2
        for k in keys:
            if k in t1:
                t1.remove(k)
                t2.push((k,))
            else:
                t2.move_to_end((k,))

    def on_remove(self, keys: Keys) -> None:
        for k in keys:
            (self._t1 if k in self._t1 else self._t2).remove(k)

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)

    def __contains__(self, key: object) -> bool:
        return key in self._t1 or key in self._t2

    def resident(self) -> Iterator[Hashable]:
        yield from self._t1
        yield from self._t2

    def _select(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        # protected keys never move between lists here, so their counts per list are fixed
        in_t1, in_t2 = count_in(protected, self._t1), count_in(protected, self._t2)
        return [self._replace(protected, in_t1, in_t2) for _ in range(n)]

    def _replace(self, protected: Collection[Hashable], in_t1: int, in_t2: int) -> Hashable:
        """Evict one key: T1's oldest while ``|T1| > p`` (or T2 has none to give), else T2's."""
        t1_free, t2_free = len(self._t1) > in_t1, len(self._t2) > in_t2
        if t1_free and (len(self._t1) > self.p or not t2_free):
            source, ghosts = self._t1, self._b1
        else:
            source, ghosts = self._t2, self._b2
        (key,) = source.pop_unprotected(1, protected)
        ghosts.push((key,))
        return key

    def check_invariants(self) -> None:
        super().check_invariants()
        c = self.capacity
        if len(self._t1) + len(self._b1) > c:
            raise AssertionError(f"arc: |T1| + |B1| = {len(self._t1) + len(self._b1)} > {c}")
        if len(self) + len(self._b1) + len(self._b2) > 2 * c:
            raise AssertionError("arc: directory larger than 2c")
        if not 0 <= self.p <= c:
            raise AssertionError(f"arc: p = {self.p} outside [0, {c}]")
        lists = [set(q) for q in (self._t1, self._t2, self._b1, self._b2)]
        if [len(x) for x in lists] != [len(q) for q in (self._t1, self._t2, self._b1, self._b2)]:
            raise AssertionError("arc: a list's length disagrees with its keys")
        if sum(map(len, lists)) != len(set().union(*lists)):
            raise AssertionError("arc: a key is in two of T1, T2, B1, B2")
