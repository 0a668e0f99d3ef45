"""``GhostFilter``: recently evicted keys in a few bits each (two rotating Bloom filters).

ARC, S3-FIFO and ``pfreq`` remember evicted keys ("ghosts") only to ask, when a key comes
back, *was it evicted recently?* (and, for ``pfreq``, of which kind). A queue of the keys
answers exactly but costs a dict entry and a deque pointer per ghost, about 100 bytes:
with ``capacity`` ghosts that alone breaks the store's 256-byte budget per resident chunk.
This filter answers the same question in about 3 bytes per remembered key.

How: two generations of blocked Bloom filters: a key's ``HASHES`` bits all lie in one
64-bit word (one array read to test them), about ``BITS_PER_KEY`` bits per key, and a
second array of words marks the keys added with ``mark=1``. Adds go to the current
generation; once it holds ``capacity`` adds, it becomes the previous one and the old
previous is dropped. A key is remembered if either generation has it.

The approximation, in both directions harmless to a policy:

* it remembers every one of the last ``capacity`` adds (no false negatives) and some of
  the ``capacity`` before (never an older one, but for false positives): a superset of a
  queue of ``capacity`` keys;
* a false positive (about 1% at these sizes) treats a new key as a returning one;
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

from array import array
from collections.abc import Hashable, Iterable, Sequence

BITS_PER_KEY = 32
HASHES = 4
"""Bits set per key (``_probe`` takes 6 hash bits for each)."""
_MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing: spreads small-int hashes over 64 bits
_MASK64 = (1 << 64) - 1


class GhostFilter:
    """Approximate set of the last ``capacity`` .. ``2 * capacity`` keys added, each with a
    1-bit mark (see the module docstring)."""

    __slots__ = ("_adds", "_bits", "_capacity", "_counts", "_generation", "_marks", "_word_mask")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"GhostFilter: capacity must be >= 1, got {capacity!r}")
        self._capacity = capacity
        self._generation = capacity  # adds per generation
        words = 1 << max(3, (BITS_PER_KEY * capacity // 64).bit_length())
        self._word_mask = words - 1
        self._bits = [_words(words), _words(words)]  # [current, previous]
        self._marks = [_words(words), _words(words)]
        self._counts = [[0, 0], [0, 0]]  # per generation: unmarked, marked adds not popped
        self._adds = 0  # adds into the current generation

    def _probe(self, key: object) -> tuple[int, int]:
        """``key``'s word and its ``HASHES`` bits in that word (6 hash bits each)."""
        h = (hash(key) * _MIX) & _MASK64
        bits = 1 << (h & 63) | 1 << (h >> 6 & 63) | 1 << (h >> 12 & 63) | 1 << (h >> 18 & 63)
        return h >> 24 & self._word_mask, bits

    def add(self, key: Hashable, mark: int = 0) -> None:
        """Remember ``key`` (evicted now), with ``mark`` 0 or 1."""
        self.add_all((key,), (mark,))

    def add_all(self, keys: Sequence[Hashable], marks: Sequence[int]) -> None:
        """``add`` each key with its mark, in order."""
        wmask, generation, adds = self._word_mask, self._generation, self._adds
        bits0, marks0, counts0 = self._bits[0], self._marks[0], self._counts[0]
        try:
            for key, mark in zip(keys, marks, strict=True):
                if adds >= generation:
                    self._rotate()
                    adds, bits0, marks0, counts0 = 0, self._bits[0], self._marks[0], self._counts[0]
                h = (hash(key) * _MIX) & _MASK64  # as in _probe, inlined: the hot loop
                w = h >> 24 & wmask
                bits = (1 << (h & 63) | 1 << (h >> 6 & 63)
                        | 1 << (h >> 12 & 63) | 1 << (h >> 18 & 63))
                bits0[w] |= bits
                if mark:
                    marks0[w] |= bits
                counts0[mark] += 1
                adds += 1
        finally:  # kept exact even if the lengths disagree (zip raises at the end)
            self._adds = adds

    def pop(self, key: Hashable) -> int | None:
        """None if ``key`` is not remembered, else its mark; discounts it from ``counts``."""
        found = self.pop_all((key,))
        return found[0][1] if found else None

    def pop_all(self, keys: Iterable[Hashable]) -> list[tuple[Hashable, int]]:
        """``pop`` each key; those remembered, with their marks, in order."""
        (bits0, bits1), wmask = self._bits, self._word_mask
        found = []
        for key in keys:
            h = (hash(key) * _MIX) & _MASK64  # as in _probe, inlined: the hot loop
            w = h >> 24 & wmask
            bits = 1 << (h & 63) | 1 << (h >> 6 & 63) | 1 << (h >> 12 & 63) | 1 << (h >> 18 & 63)
            if bits0[w] & bits == bits:
                gen = 0
            elif bits1[w] & bits == bits:
                gen = 1
            else:
                continue
            mark = int(self._marks[gen][w] & bits == bits)
            counts = self._counts[gen]
            counts[mark] = max(0, counts[mark] - 1)
            found.append((key, mark))
        return found

    def __contains__(self, key: object) -> bool:
        w, bits = self._probe(key)
        return self._bits[0][w] & bits == bits or self._bits[1][w] & bits == bits

    def __len__(self) -> int:
        """Keys remembered and not popped (approximately: a false positive is popped too)."""
        return sum(map(sum, self._counts))

    def counts(self) -> tuple[int, int]:
        """Remembered keys (not popped) by mark: (unmarked, marked)."""
        (u0, m0), (u1, m1) = self._counts
        return u0 + u1, m0 + m1

    def _rotate(self) -> None:
        """The current generation becomes the previous; the old previous is forgotten."""
        words = len(self._bits[0])
        self._bits = [_words(words), self._bits[0]]
        self._marks = [_words(words), self._marks[0]]
        self._counts = [[0, 0], self._counts[0]]
        self._adds = 0

    def check_invariants(self) -> None:
        if len(self) > 2 * self._generation or self._adds > self._generation:
            raise AssertionError(f"GhostFilter: {len(self)} keys over 2 x {self._capacity}")


def _words(n: int) -> array[int]:
    return array("Q", bytes(8 * n))
