"""Prefix-aware, frequency-weighted recency ("pfreq"): what a KV cache knows and LRU does not.

Two facts about KV chunks drive it:

* **Prefix.** A hit needs the whole prefix, so a chunk is worthless once its predecessor is
  gone: a chunk never outranks its parent. Leaves go before their ancestors, and a
  request's tail before its head.
* **Frequency.** Most chunks are seen once; a chunk seen twice is likely seen again (on
  the Mooncake conversation trace, 24% of chunks come back, but 42% of those that came
  back once come back again). So recency is weighted by how often a key was seen
  recently, remembered beyond eviction by a count-min sketch (as in TinyLFU).

Each resident chunk has a score; the lowest is evicted first::

    score = min(t + bonus(f), score(parent) - 1)
    bonus(f) = beta * capacity * (0, 0, 1, 4)[min(f, 3)]

``t`` is the policy's clock at the chunk's last use (one tick per key reported), ``f`` how
often the key was seen in the sketch's window (10 x capacity uses, then halved). The
parent is the hinted one (``on_insert_with_parents``), else the previous key of the batch.

``beta`` (0 .. 8) adapts as ARC's target does: a ghost queue remembers ``capacity``
recently evicted keys and whether they were frequent (``f >= 2``). A miss on a ghost that
was evicted infrequent says recency was short: ``beta`` drops; a miss on a frequent ghost
says frequency was undervalued: ``beta`` rises; each step scaled by the other ghost kind's
share, as in ARC. It starts at 0, where ``pfreq`` is LRU with tail-first eviction.

Worked example (capacity 4, beta 0): a request stores a b c (a parent of b, b of c);
scores 1, 0, -1 (clamped below each parent). ``victims(1)`` is ``c``, the tail, though LRU
would take ``a``, the head, and leave b and c unusable.

>>> p = PrefixFrequency(4)
>>> p.on_insert(["a", "b", "c"]); p.victims(1)
['c']
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Hashable, Iterator, Sequence

from kvtier.store.policies.base import Keys, Policy
from kvtier.store.policies.queue import KeyQueue

BONUS = (0, 0, 1, 4)
"""Bonus per ``min(f, 3)``, in units of ``beta * capacity`` clock ticks."""
MAX_BETA = 8.0
SKETCH_WINDOW = 10
"""The sketch is halved every ``SKETCH_WINDOW * capacity`` increments (TinyLFU's sample)."""
_HALVE = bytes(b >> 1 for b in range(256))


class FrequencySketch:
    """Approximate recent counts (0..15) of hashable keys: a two-row count-min sketch.

    >>> s = FrequencySketch(16)
    >>> [s.add(k) for k in "aab"], s.estimate("a")
    ([1, 2, 1], 2)
    """

    __slots__ = ("_added", "_counts", "_mask", "_window")

    def __init__(self, capacity: int) -> None:
        width = 1 << max(10, (4 * capacity - 1).bit_length())
        self._counts = bytearray(2 * width)
        self._mask = width - 1
        self._window = SKETCH_WINDOW * capacity
        self._added = 0

    def _cells(self, key: Hashable) -> tuple[int, int]:
        h = hash(key)
        return h & self._mask, self._mask + 1 + ((h >> 20) & self._mask)

    def estimate(self, key: Hashable) -> int:
        i, j = self._cells(key)
        return min(self._counts[i], self._counts[j])

    def add(self, key: Hashable) -> int:
        """Count one use of ``key``; its estimate after counting."""
        counts = self._counts
        i, j = self._cells(key)
        f = min(counts[i], counts[j]) + 1
        if f <= 15:  # conservative update: raise only the cells below the new estimate
            counts[i], counts[j] = max(counts[i], f), max(counts[j], f)
        self._added += 1
        if self._added >= self._window:
            self._added = 0
            self._counts = counts.translate(_HALVE)
        return min(f, 15)


class PrefixFrequency(Policy):
    """Prefix-closed, frequency-weighted recency over ``capacity`` slots (module doc)."""

    name = "pfreq"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.beta = 0.0
        """The current weight of frequency against recency (0 .. ``MAX_BETA``)."""
        self._score: dict[Hashable, int] = {}
        self._heap: list[tuple[int, Hashable]] = []  # (score, key); stale when score differs
        self._sketch = FrequencySketch(capacity)
        self._ghosts = KeyQueue()  # evicted keys; value 1 if evicted frequent
        self._ghost_kinds = [0, 0]
        self._clock = 0

    # ---- notifications -----------------------------------------------------------------

    def on_insert(self, keys: Keys) -> None:
        self.on_insert_with_parents(keys, ())

    def on_insert_with_parents(self, keys: Keys, parents: Sequence[Hashable | None]) -> None:
        ghosts = self._ghosts
        if ghosts:
            for k in keys:
                if k in ghosts:
                    kind = ghosts.value(k)
                    ghosts.remove(k)
                    self._adapt(kind)
        self._use(keys, parents)

    def on_access(self, keys: Keys) -> None:
        self._use(keys, ())

    def on_remove(self, keys: Keys) -> None:
        for k in keys:
            del self._score[k]

    def _use(self, keys: Keys, parents: Sequence[Hashable | None]) -> None:
        """Score each key: recency plus its frequency bonus, capped below its parent."""
        score, heap, add = self._score, self._heap, self._sketch.add
        unit = self.beta * self.capacity
        clock, prev = self._clock, None
        for i, k in enumerate(keys):
            clock += 1
            s = clock + int(unit * BONUS[min(add(k), 3)])
            parent_score = score.get(parents[i] if parents else prev)
            if parent_score is not None and s >= parent_score:
                s = parent_score - 1
            score[k] = s
            heapq.heappush(heap, (s, k))
            prev = k
        self._clock = clock
        if len(heap) > len(score) + (len(score) >> 2) + 64:  # at most 1.25 entries a key
            self._heap = [(s, k) for k, s in score.items()]
            heapq.heapify(self._heap)

    def _adapt(self, kind: int) -> None:
        """A miss on a ghost of ``kind`` (1: evicted frequent): move beta as ARC moves p."""
        self._ghost_kinds[kind] -= 1
        rare, frequent = self._ghost_kinds
        step = MAX_BETA / (4 * self.capacity)
        if kind:
            self.beta = min(MAX_BETA, self.beta + step * max(1.0, rare / max(1, frequent)))
        else:
            self.beta = max(0.0, self.beta - step * max(1.0, frequent / max(1, rare)))

    # ---- queries and victims -----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._score)

    def __contains__(self, key: object) -> bool:
        return key in self._score

    def resident(self) -> Iterator[Hashable]:
        return iter(self._score)

    def _select(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        score, heap = self._score, self._heap
        chosen: list[Hashable] = []
        passed: list[tuple[int, Hashable]] = []
        while len(chosen) < n:
            entry = heapq.heappop(heap)
            k = entry[1]
            if score.get(k) != entry[0]:
                continue  # stale: used again, evicted or removed since
            if k in protected:
                passed.append(entry)
                continue
            del score[k]
            chosen.append(k)
            self._remember(k)
        for entry in passed:
            heapq.heappush(heap, entry)
        return chosen

    def _remember(self, key: Hashable) -> None:
        kind = int(self._sketch.estimate(key) >= 2)
        self._ghosts.push((key,), kind)
        self._ghost_kinds[kind] += 1
        if len(self._ghosts) > self.capacity:
            self._ghost_kinds[self._ghosts.pop_oldest()[1]] -= 1

    def check_invariants(self) -> None:
        super().check_invariants()
        live = {k for s, k in self._heap if self._score.get(k) == s}
        if live != self._score.keys():
            raise AssertionError("pfreq: a resident key has no live heap entry")
        if sum(self._ghost_kinds) != len(self._ghosts) or min(self._ghost_kinds) < 0:
            raise AssertionError("pfreq: ghost counts disagree with the ghost queue")
