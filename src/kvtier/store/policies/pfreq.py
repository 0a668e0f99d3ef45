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

``beta`` (0 .. 8) adapts as ARC's target does: a ghost filter (``GhostFilter``, a few
bits a key) remembers the last ``capacity / 2`` to ``capacity`` evicted keys and whether
they were frequent (``f >= 2``). A miss on a ghost that was evicted infrequent says
recency was short: ``beta`` drops; a miss on a frequent ghost says frequency was
undervalued: ``beta`` rises; each step scaled by the other ghost kind's share, as in ARC.
It starts at 0, where ``pfreq`` is LRU with tail-first eviction.

Storage, sized for the store's 256-byte budget per resident chunk, and grown with the keys
stored, not allocated for the capacity: each resident key
holds a slot of a ``SlotTable`` (no dict); scores live in an ``array`` by slot; the heap
is a list of packed ints ``score << shift | slot`` (stale when the slot's score has
changed since; rebuilt once stale entries reach half the keys).

Worked example (capacity 4, beta 0): a request stores a b c (a parent of b, b of c);
scores 1, 0, -1 (clamped below each parent). ``victims(1)`` is ``c``, the tail, though LRU
would take ``a``, the head, and leave b and c unusable.

>>> p = PrefixFrequency(4)
>>> p.on_insert(["a", "b", "c"]); p.victims(1)
['c']
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence
from itertools import compress, count, repeat
from operator import is_not, lshift, or_
from typing import Final

from mypy_extensions import mypyc_attr

from kvtier.store.policies.base import Keys, Policy
from kvtier.store.policies.cells import Cells, map_cells, new_cells, settle
from kvtier.store.policies.ghost import GhostFilter, stable_hash
from kvtier.store.policies.slots import SlotTable

BONUS: Final = (0, 0, 1, 4)
"""Bonus per ``min(f, 3)``, in units of ``beta * capacity`` clock ticks."""
MAX_BETA = 8.0
SKETCH_WINDOW = 10
"""The sketch is halved every ``SKETCH_WINDOW * capacity`` increments (TinyLFU's sample)."""
_HALVE: Final = bytes(b >> 1 for b in range(256))


class FrequencySketch:
    """Approximate recent counts (0..15) of hashable keys: a two-row count-min sketch.

    >>> s = FrequencySketch(16)
    >>> [s.add(k) for k in "aab"], s.estimate("a")
    ([1, 2, 1], 2)
    """

    __slots__ = ("_added", "_counts", "_mask", "_size", "_window")

    def __init__(self, capacity: int) -> None:
        width = 1 << max(10, (4 * capacity - 1).bit_length())
        self._size = 2 * width
        self._counts: Cells = new_cells(self._size)  # allocated as written (``cells``)
        self._mask = width - 1
        self._window = SKETCH_WINDOW * capacity
        self._added = 0

    def estimate(self, key: Hashable) -> int:
        h, mask, counts = stable_hash(key), self._mask, self._counts
        return min(counts[h & mask], counts[mask + 1 + ((h >> 20) & mask)])

    def frequent(self, keys: Iterable[Hashable]) -> list[int]:
        """1 for each key whose estimate is at least 2, else 0."""
        mask, counts = self._mask, self._counts
        return [
            int(counts[h & mask] >= 2 and counts[mask + 1 + ((h >> 20) & mask)] >= 2)
            for h in map(stable_hash, keys)
        ]

    def add(self, key: Hashable) -> int:
        """Count one use of ``key``; its estimate after counting."""
        return self.add_all((key,))[0]

    def add_all(self, keys: Iterable[Hashable]) -> list[int]:
        """Count one use of each key, in order; their estimates after counting."""
        counts, mask, out = self._counts, self._mask, []
        added, window = self._added, self._window
        for key in keys:
            h = stable_hash(key)
            i, j = h & mask, mask + 1 + ((h >> 20) & mask)
            ci, cj = counts[i], counts[j]
            f = (ci if ci < cj else cj) + 1
            if f <= 15:  # conservative update: raise only the cells below the new estimate
                if ci < f:
                    counts[i] = f
                if cj < f:
                    counts[j] = f
            else:
                f = 15
            out.append(f)
            added += 1
            if added >= window:
                added = 0
                map_cells(counts, _HALVE)
        self._added = added
        self._counts = settle(counts, self._size)
        return out


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixFrequency(Policy):
    """Prefix-closed, frequency-weighted recency over ``capacity`` slots (module doc)."""

    name = "pfreq"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.beta = 0.0
        """The current weight of frequency against recency (0 .. ``MAX_BETA``)."""
        self._table = SlotTable(capacity)  # resident key <-> slot
        self._score = array("q")  # score by slot, grown with the slots used (_grow_scores)
        self._shift = capacity.bit_length()
        self._heap: list[int] = []  # score << shift | slot; stale unless it is that slot's
        self._sketch = FrequencySketch(capacity)
        # evicted keys, marked if evicted frequent: the last capacity / 2 .. capacity
        self._ghosts = GhostFilter(max(1, capacity // 2))
        self._clock = 0
        self._bonus_unit = 0.0  # beta * capacity when _bonus was computed
        self._bonus = [0] * 16

    # ---- notifications -----------------------------------------------------------------

    def on_insert(self, keys: Keys) -> None:
        self.on_insert_with_parents(keys, ())

    def on_insert_with_parents(self, keys: Keys, parents: Sequence[Hashable | None]) -> None:
        if len(self._ghosts):
            for _, kind in self._ghosts.pop_all(keys):
                self._adapt(kind)
        slots = self._table.add_all(keys)
        self._grow_scores()
        self._use(keys, slots, parents)

    def _grow_scores(self) -> None:
        """A score for every slot the table has handed out (``SlotTable.keys``)."""
        missing = len(self._table.keys) - len(self._score)
        if missing > 0:
            self._score.frombytes(bytes(8 * missing))

    def on_access(self, keys: Keys) -> None:
        self._use(keys, self._table.find_all(keys), ())

    def on_remove(self, keys: Keys) -> None:
        table = self._table
        for k in keys:
            slot = table.find(k)
            assert slot is not None, k
            table.remove_slot(slot)

    def _use(
        self, keys: Keys, slots: Sequence[int | None], parents: Sequence[Hashable | None]
    ) -> None:
        """Score each key: recency plus its frequency bonus, capped below its parent."""
        score, heap, find, push = self._score, self._heap, self._table.find, heapq.heappush
        freqs = self._sketch.add_all(keys)
        unit, shift = self.beta * self.capacity, self._shift
        if unit != self._bonus_unit:  # beta moved: the bonus by estimate (0..15) again
            self._bonus = [int(unit * BONUS[min(f, 3)]) for f in range(16)]
            self._bonus_unit = unit
        bonus = self._bonus
        clock, prev, prev_slot = self._clock, None, None
        if not parents:  # each key's parent is the previous key of the batch
            for k, slot, f in zip(keys, slots, freqs, strict=True):
                clock += 1
                s = clock + bonus[f]
                if prev_slot is not None and s >= score[prev_slot]:
                    s = score[prev_slot] - 1
                assert slot is not None, k
                score[slot] = s
                push(heap, s << shift | slot)
                prev_slot = slot
        else:
            for i, k in enumerate(keys):
                clock += 1
                s = clock + bonus[freqs[i]]
                parent = parents[i]
                parent_slot = prev_slot  # the usual case: the previous key of the batch
                if parent is not prev:
                    parent_slot = None if parent is None else find(parent)
                if parent_slot is not None and s >= score[parent_slot]:
                    s = score[parent_slot] - 1
                slot = slots[i]
                assert slot is not None, k
                score[slot] = s
                push(heap, s << shift | slot)
                prev, prev_slot = k, slot
        self._clock = clock
        live = len(self._table)
        if len(heap) > live + (live >> 1) + 64:  # at most 1.5 entries a key
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        # [score[s] << shift | s for each slot s holding a key], at C speed
        entries = map(or_, map(lshift, self._score, repeat(self._shift)), count())
        if len(self._table) == self.capacity:  # every slot holds a key (the usual case)
            self._heap = list(entries)
        else:
            self._heap = list(compress(entries, map(is_not, self._table.keys, repeat(None))))
        heapq.heapify(self._heap)

    def _adapt(self, kind: int) -> None:
        """A miss on a ghost of ``kind`` (1: evicted frequent): move beta as ARC moves p."""
        rare, frequent = self._ghosts.counts()
        step = MAX_BETA / (4 * self.capacity)
        if kind:
            self.beta = min(MAX_BETA, self.beta + step * max(1.0, rare / max(1, frequent)))
        else:
            self.beta = max(0.0, self.beta - step * max(1.0, frequent / max(1, rare)))

    # ---- queries and victims -----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, key: object) -> bool:
        return key in self._table

    def resident(self) -> Iterator[Hashable]:
        return iter(self._table)

    def _select(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        score, heap, table, keys = self._score, self._heap, self._table, self._table.keys
        shift, slot_mask = self._shift, (1 << self._shift) - 1
        chosen: list[Hashable] = []
        passed: list[int] = []
        while len(chosen) < n:
            entry = heapq.heappop(heap)
            slot = entry & slot_mask
            k = keys[slot]
            if k is None or score[slot] != entry >> shift:
                continue  # stale: used again, evicted or removed since
            if k in protected:
                passed.append(entry)
                continue
            table.remove_slot(slot)
            chosen.append(k)
        for entry in passed:
            heapq.heappush(heap, entry)
        self._ghosts.add_all(chosen, self._sketch.frequent(chosen))
        return chosen

    def check_invariants(self) -> None:
        super().check_invariants()
        self._table.check_invariants()
        self._ghosts.check_invariants()
        keys, mask = self._table.keys, (1 << self._shift) - 1
        live = {e & mask for e in self._heap if self._score[e & mask] == e >> self._shift}
        if any(k is not None and s not in live for s, k in enumerate(keys)):
            raise AssertionError("pfreq: a resident key has no live heap entry")
