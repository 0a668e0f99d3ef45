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

Storage: each list is an ``OrderedKeys``, a plain dict in insertion order, kept at the
size a fresh copy would have; nothing else per key. The directory holds up to ``2 c`` keys
(``c`` resident, up to ``c`` ghosts, exactly, as the paper's lists), so its dicts are most of
the policy's bytes: about 60 to 100 per resident chunk. Four separate dicts cost no more
than one shared one (whose value would name the list) and keep each list's order for free.

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

import math
from collections.abc import Collection, Hashable, Iterator

from kvtier.store.policies.base import Keys, Policy, count_in
from kvtier.store.policies.queue import OrderedKeys


class ARC(Policy):
    """Adaptive replacement over ``capacity`` slots (see the module docstring)."""

    name = "arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = 0.0
        """Target size of ``T1``, in ``[0, capacity]``."""
        self._t1, self._t2 = OrderedKeys(), OrderedKeys()
        self._b1, self._b2 = OrderedKeys(), OrderedKeys()

    def on_insert(self, keys: Keys) -> None:
        # One key at a time, as in the paper, with list sizes kept in local counts. T1 and T2
        # are only counted here (ghost trims read their sizes, never their order), so the
        # keys bound for them are pushed together at the end, in the same order. Ghost
        # trims are owed and paid in batches: before a key that may be a ghost is tested
        # (a trim may forget it) and at the end. Only keys that are ghosts now can be ghost
        # hits below: trims forget ghosts, nothing here adds one.
        c = self.capacity
        b1, b2 = self._b1, self._b2
        n_t1, n_t2, n_b1, n_b2 = len(self._t1), len(self._t2), len(b1), len(b2)
        ghosts = set(b1.live_among(keys)) if n_b1 else set()
        if n_b2:
            ghosts.update(b2.live_among(keys))
        trim1 = trim2 = 0
        to_t1, to_t2 = [], []
        for key in keys:
            where = 0
            if ghosts and key in ghosts:
                if trim1 or trim2:
                    b1.drop_oldest(trim1)
                    b2.drop_oldest(trim2)
                    trim1 = trim2 = 0
                where = 1 if key in b1 else 2 if key in b2 else 0
            if where == 1:
                self.p = min(float(c), self.p + max(n_b2 / n_b1, 1.0))
                b1.remove(key)
                n_b1 -= 1
                to_t2.append(key)
                n_t2 += 1
            elif where == 2:
                self.p = max(0.0, self.p - max(n_b1 / n_b2, 1.0))
                b2.remove(key)
                n_b2 -= 1
                to_t2.append(key)
                n_t2 += 1
            else:
                # keep |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c after the insert
                if n_t1 + n_b1 >= c:
                    if n_b1:
                        trim1 += 1
                        n_b1 -= 1
                elif n_t1 + n_t2 + n_b1 + n_b2 >= 2 * c and n_b2:
                    trim2 += 1
                    n_b2 -= 1
                to_t1.append(key)
                n_t1 += 1
        b1.drop_oldest(trim1)
        b2.drop_oldest(trim2)
        self._t1.push(to_t1)
        self._t2.push(to_t2)

    def on_access(self, keys: Keys) -> None:
        # keys in T1 move to T2's new end; keys in T2 move to its new end, in access order
        self._t2.move_from(self._t1, keys)

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
        from_t1 = self._split(n, protected)
        chosen = self._t1.pop_unprotected(from_t1, protected) if from_t1 else []
        self._b1.push(chosen)
        if from_t1 < n:
            from_t2 = self._t2.pop_unprotected(n - from_t1, protected)
            self._b2.push(from_t2)
            chosen += from_t2
        return chosen

    def _split(self, n: int, protected: Collection[Hashable]) -> int:
        """How many of ``n`` victims come from T1: one at a time, T1's oldest while
        ``|T1| > p`` (or T2 has none to give), else T2's. Protected keys stay in their
        list, so each list's unprotected count just drops by one per victim taken: T1
        gives while it is over ``p`` (``ceil(|T1| - p)`` times, if it has that many
        unprotected keys), then T2 until it has none left, then T1 the rest.

        >>> arc = ARC(8); arc.on_insert(list("abcde")); arc.on_access(list("ab")); arc.p = 1.5
        >>> arc._split(4, ()), arc._split(3, {"c", "d"}), arc._split(3, {"b"})
        (2, 1, 2)
        """
        size_t1 = len(self._t1)
        free_t1 = size_t1 - count_in(protected, self._t1)
        free_t2 = len(self._t2) - count_in(protected, self._t2)
        over = math.ceil(size_t1 - self.p) if size_t1 > self.p else 0
        first = min(n, free_t1, over)
        return first + max(0, n - first - free_t2)

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
