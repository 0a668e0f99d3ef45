"""``GhostFilter``: recently evicted keys in a few bytes each (a Bloom filter that ages).

ARC, S3-FIFO and ``pfreq`` remember evicted keys ("ghosts") only to ask, when a key comes
back, *was it evicted recently?* (and, for ``pfreq``, of which kind). A queue of the keys
answers exactly but costs a dict entry and a deque pointer per ghost, about 100 bytes:
with ``capacity`` ghosts that alone breaks the store's 256-byte budget per resident chunk.
This filter answers the same question in about 16 bytes per remembered key.

How: one table of byte cells, a power of two in number and at least ``cells_per_key``
(default ``CELLS_PER_KEY``) per key of ``capacity``: so between that and twice it, but
allocated as cells are written (``kvtier.store.policies.cells``: a dict of the written
cells, then the ``bytearray`` once that is smaller), so that a filter for 10**9 keys costs
nothing until keys are added, and its memory grows with the keys it remembers. An add
is stamped with a code, ``generation * 2 + mark``, into the ``HASHES`` cells its hash picks,
each cell keeping the largest code written to it. Adds belong to the current generation;
once it holds ``capacity`` adds, the next generation begins, and a key is remembered while
every one of its cells holds a code of the current or the previous generation (codes only
grow, so a later add never hides an earlier one). Forgetting a generation is thus just
moving the floor; no cell is cleared (the codes are renumbered, at C speed, when the
generation number would overflow a byte). Why cells and not bits: a test reads three
bytes, a few small-int operations in Python, where bits in a 64-bit word cost four times
as much in big-int arithmetic.

The approximation, in both directions harmless to a policy:

* it remembers every one of the last ``capacity`` adds (no false negatives) and some of
  the ``capacity`` before (never an older one, but for false positives): a superset of a
  queue of ``capacity`` keys;
* a false positive treats a new key as a returning one: under 0.5% at the default 32 to
  64 cells per key; with ``cells_per_key=16`` (16 to 32 cells: half the bytes, what S3-FIFO
  uses) 0.5% on average at 29 cells per key, 1.7% at 18 (2.4% at worst, just before a
  generation is forgotten), measured with random keys (``tests/store``);
* a mark is read from the smallest of a key's codes, so a key whose cells were all
  stamped later may report another key's mark;
* a key cannot be deleted: ``pop`` reports it and discounts it from ``counts`` once, but a
  second ``pop`` of the same key may still find it.

Worked example: capacity 2. Add a, b (generation 1 full), then c (a new generation 2);
all three are remembered; add d, e: generation 2 is full with c, d and e starts generation
3, dropping generation 1 (a, b).

>>> g = GhostFilter(2)
>>> for k in "abc": g.add(k)
>>> [k in g for k in "abc"], g.pop("x")
([True, True, True], None)
>>> for k in "de": g.add(k, mark=1)
>>> [k in g for k in "abcde"], g.pop("d"), g.counts()
([False, False, True, True, True], 1, (1, 1))
"""

from __future__ import annotations

import struct
from collections.abc import Hashable, Iterable, Sequence
from typing import Final

from kvtier.store.policies.cells import Cells, map_cells, max_cell, new_cells, settle

CELLS_PER_KEY = 32
"""The default least number of cells per key of ``capacity`` (rounded up to a power of two)."""
HASHES = 3
"""Cells stamped per key, each picked by its own bits of the key's mixed hash."""
_MIX: Final = 0x9E3779B97F4A7C15  # Fibonacci hashing: spreads small-int hashes over many bits
_MASK: Final = (1 << 64) - 1
_HALVES: Final = struct.Struct("<QQ")  # a chunk key's group tag and the first 8 bytes of its digest


def stable_hash(key: object) -> int:
    """A hash of ``key`` that is the same in every process: for a chunk key (bytes of 16 or
    more), its tag mixed with 8 bytes of its digest (``kvtier.store.admission``'s
    fingerprint), so that a policy's approximate answers (a false positive here, a sketch's
    collision) do not change with Python's per-process salt of ``hash(bytes)``; for any
    other key, ``hash``.

    >>> stable_hash(bytes(8) + bytes([1]) + bytes(31)), stable_hash(7)
    (1, 7)
    """
    if type(key) is bytes and len(key) >= 16:
        tag, digest = _HALVES.unpack_from(key)
        return (tag * _MIX ^ digest) & _MASK
    return hash(key)


_LAST_GENERATION: Final = 127
"""Codes are ``generation * 2 + mark`` in a byte; generation 0 means never stamped."""
_SAME: Final = bytes(range(256))
_RENUMBER: Final = bytes(2 + (c & 1) if c >> 1 == _LAST_GENERATION else 0 for c in range(256))
"""The last generation's codes become generation 1's; every other code 0 (forgotten)."""


class GhostFilter:
    """Approximate set of the last ``capacity`` .. ``2 * capacity`` keys added, each with a
    1-bit mark (see the module docstring)."""

    __slots__ = ("_adds", "_capacity", "_cells", "_counts", "_floor", "_gen", "_mask", "_shift",
                 "_size")

    def __init__(self, capacity: int, *, cells_per_key: int = CELLS_PER_KEY) -> None:
        if capacity < 1:
            raise ValueError(f"GhostFilter: capacity must be >= 1, got {capacity!r}")
        if cells_per_key < 4:
            raise ValueError(f"GhostFilter: cells_per_key must be >= 4, got {cells_per_key!r}")
        self._capacity = capacity  # adds per generation
        size = self._size = 1 << max(10, (cells_per_key * capacity - 1).bit_length())
        self._cells: Cells = new_cells(size)
        self._mask = size - 1
        self._shift = size.bit_length()  # each probe reads its own bits of the hash
        self._gen = 1  # the current generation
        self._floor = 2  # the smallest code remembered: generation max(1, _gen - 1), unmarked
        self._counts = [[0, 0], [0, 0]]  # current, previous: unmarked, marked adds not popped
        self._adds = 0  # adds into the current generation

    def _cells_of(self, key: object) -> tuple[int, int, int]:
        h = stable_hash(key) * _MIX
        mask, s = self._mask, self._shift
        return h & mask, h >> s & mask, h >> 2 * s & mask

    def add(self, key: Hashable, mark: int = 0) -> None:
        """Remember ``key`` (evicted now), with ``mark`` 0 or 1."""
        self.add_all((key,), (mark,))

    def add_all(self, keys: Sequence[Hashable], marks: Sequence[int]) -> None:
        """``add`` each key with its mark, in order."""
        if len(keys) != len(marks):
            raise ValueError(f"GhostFilter.add_all: {len(keys)} keys, {len(marks)} marks")
        cells, mask, s, s2 = self._cells, self._mask, self._shift, 2 * self._shift
        counts, code0, adds = self._counts[0], 2 * self._gen, self._adds
        for key, mark in zip(keys, marks, strict=True):
            if adds >= self._capacity:
                self._adds = adds
                self._rotate()
                counts, code0, adds = self._counts[0], 2 * self._gen, 0
            code = code0 + mark
            h = stable_hash(key) * _MIX  # as in _cells_of, inlined: the hot loop
            i, j, k = h & mask, h >> s & mask, h >> s2 & mask
            if mark or not counts[1]:  # no cell holds a larger code yet: just stamp
                cells[i] = cells[j] = cells[k] = code
            else:
                if cells[i] < code:
                    cells[i] = code
                if cells[j] < code:
                    cells[j] = code
                if cells[k] < code:
                    cells[k] = code
            counts[mark] += 1
            adds += 1
        self._adds = adds
        self._cells = settle(self._cells, self._size)

    def pop(self, key: Hashable) -> int | None:
        """None if ``key`` is not remembered, else its mark; discounts it from ``counts``."""
        found = self.pop_all((key,))
        return found[0][1] if found else None

    def pop_all(self, keys: Iterable[Hashable]) -> list[tuple[Hashable, int]]:
        """``pop`` each key; those remembered, with their marks, in order."""
        cells, mask, s, s2 = self._cells, self._mask, self._shift, 2 * self._shift
        floor, current = self._floor, 2 * self._gen  # the smallest codes remembered, and current
        found = []
        for key in keys:
            h = stable_hash(key) * _MIX  # as in _cells_of, inlined: the hot loop
            low = cells[h & mask]
            if low < floor:  # most keys asked about are not ghosts: one cell says so
                continue
            c = cells[h >> s & mask]
            if c < low:
                low = c
            c = cells[h >> s2 & mask]
            if c < low:
                low = c
            if low >= floor:
                mark = low & 1
                counts = self._counts[0 if low >= current else 1]
                counts[mark] = max(0, counts[mark] - 1)
                found.append((key, mark))
        return found

    def __contains__(self, key: object) -> bool:
        cells = self._cells
        return min(cells[x] for x in self._cells_of(key)) >= self._floor

    def __len__(self) -> int:
        """Keys remembered and not popped (approximately: a false positive is popped too)."""
        (u0, m0), (u1, m1) = self._counts
        return u0 + m0 + u1 + m1

    def counts(self) -> tuple[int, int]:
        """Remembered keys (not popped) by mark: (unmarked, marked)."""
        (u0, m0), (u1, m1) = self._counts
        return u0 + u1, m0 + m1

    def _rotate(self) -> None:
        """The current generation becomes the previous; the old previous is forgotten."""
        renumber = self._gen == _LAST_GENERATION  # the current generation becomes 1
        if renumber:
            self._gen = 1
        self._gen += 1
        floor = self._floor = 2 * (self._gen - 1)
        self._counts = [[0, 0], self._counts[0]]
        self._adds = 0
        if renumber or not isinstance(self._cells, bytearray):
            # in place (callers hold the table); a sparse one also drops forgotten cells
            map_cells(self._cells, _RENUMBER if renumber else _SAME, lambda c: c >= floor)

    def check_invariants(self) -> None:
        if len(self) > 2 * self._capacity or self._adds > self._capacity:
            raise AssertionError(f"GhostFilter: {len(self)} keys over 2 x {self._capacity}")
        if max_cell(self._cells) > 2 * self._gen + 1:
            raise AssertionError("GhostFilter: a cell is stamped by a future generation")
