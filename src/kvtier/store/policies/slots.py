"""``SlotTable``: resident keys <-> dense slot numbers, in about 20 bytes a key, no dict.

A policy that keeps a number per key (``pfreq``'s score) would naturally use a dict of
key -> int: about 100 bytes per key at the sizes the store runs at (a dict's entry table
is kept 1.5-3x larger than its contents, 24 bytes an entry, and every value above 256 is
its own 32-byte int object). Here each resident key owns a slot number in
``0 .. capacity - 1``: ``keys[slot]`` is the key (8 bytes, a list pointer), and the policy
keeps its numbers in ``array``s indexed by slot (8 bytes each). Finding a key's slot is an
open-addressing hash index: ``array('i')`` of ``slot + 1`` (0: empty), at least twice the
keys held (load <= 1/2; it doubles as keys arrive, so nothing is allocated for the
capacity up front), linear probing from ``hash(key)``, deletion by backward shift (no
tombstones, so probe runs never grow with churn).

Worked example: capacity 2, index of 8 cells. ``add("a")`` takes slot 0, ``add("b")``
slot 1; removing "a" frees slot 0, which the next ``add`` reuses.

>>> t = SlotTable(2)
>>> t.add("a"), t.add("b"), t.find("b"), t.find("c")
(0, 1, 1, None)
>>> t.remove_slot(0); t.add("c"), len(t), sorted(t)
(0, 2, ['b', 'c'])
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterable, Iterator
from typing import Final

_MIN_INDEX: Final = 8
"""The index's first size, in cells (a power of two)."""


class SlotTable:
    """A set of at most ``capacity`` keys, each with a slot number (module docstring)."""

    __slots__ = ("_free", "_index", "_len", "_mask", "keys")

    def __init__(self, capacity: int) -> None:
        self.keys: list[Hashable | None] = []
        """``keys[slot]``: the key holding ``slot``, None if free; as long as the most slots
        ever used at once (it grows, never past ``capacity``). Read-only for callers."""
        self._index = array("i", bytes(4 * _MIN_INDEX))  # grown by _reserve, load <= 1/2
        self._mask = _MIN_INDEX - 1
        self._free: list[int] = []  # freed slots, reused first
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __contains__(self, key: object) -> bool:
        return self.find(key) is not None

    def __iter__(self) -> Iterator[Hashable]:
        return (k for k in self.keys if k is not None)

    def find(self, key: object) -> int | None:
        """The slot of ``key``, or None if it is not here."""
        index, keys, mask = self._index, self.keys, self._mask
        i = hash(key) & mask
        while s := index[i]:
            if keys[s - 1] == key:
                return s - 1
            i = (i + 1) & mask
        return None

    def find_all(self, keys: Iterable[object]) -> list[int | None]:
        """``find`` of each key, in order (the probe inlined: one call for a batch)."""
        index, table, mask = self._index, self.keys, self._mask
        out: list[int | None] = []
        for key in keys:
            i = hash(key) & mask
            while s := index[i]:
                if table[s - 1] == key:
                    out.append(s - 1)
                    break
                i = (i + 1) & mask
            else:
                out.append(None)
        return out

    def add_all(self, keys: Iterable[Hashable]) -> list[int]:
        """``add`` each absent key, in order; their slots (the probe inlined)."""
        batch = keys if isinstance(keys, (list, tuple)) else list(keys)
        self._reserve(len(batch))
        index, table, mask, free = self._index, self.keys, self._mask, self._free
        out = []
        for key in batch:
            if free:
                slot = free.pop()
                table[slot] = key
            else:
                slot = len(table)
                table.append(key)
            i = hash(key) & mask
            while index[i]:
                i = (i + 1) & mask
            index[i] = slot + 1
            out.append(slot)
        self._len += len(out)
        return out

    def add(self, key: Hashable) -> int:
        """Give an absent ``key`` a free slot (one must exist) and return it."""
        return self.add_all((key,))[0]

    def _reserve(self, n: int) -> None:
        """Grow the index (doubling, rehashing every key) so that ``n`` more keep its load
        at most 1/2: its size follows the keys held, not the capacity."""
        size = len(self._index)
        if 2 * (self._len + n) <= size:
            return
        while 2 * (self._len + n) > size:
            size *= 2
        index, mask = array("i", bytes(4 * size)), size - 1
        for slot, key in enumerate(self.keys):
            if key is not None:
                i = hash(key) & mask
                while index[i]:
                    i = (i + 1) & mask
                index[i] = slot + 1
        self._index, self._mask = index, mask

    def remove_slot(self, slot: int) -> None:
        """Free ``slot`` and forget its key (backward-shift deletion from the index)."""
        index, keys, mask = self._index, self.keys, self._mask
        key = keys[slot]
        i = hash(key) & mask
        while index[i] != slot + 1:
            i = (i + 1) & mask
        j = i
        while True:  # pull later entries of the probe run back over the hole at i
            j = (j + 1) & mask
            s = index[j]
            if not s:
                break
            home = hash(keys[s - 1]) & mask
            if (j - home) & mask >= (j - i) & mask:  # s may live at i: move it there
                index[i] = s
                i = j
        index[i] = 0
        keys[slot] = None
        self._free.append(slot)
        self._len -= 1

    def check_invariants(self) -> None:
        live = [s for s, k in enumerate(self.keys) if k is not None]
        if len(live) != self._len or any(self.find(self.keys[s]) != s for s in live):
            raise AssertionError("SlotTable: a resident key is not found at its slot")
        if sorted(s - 1 for s in self._index if s) != live:
            raise AssertionError("SlotTable: the index disagrees with the slots")
