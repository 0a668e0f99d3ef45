"""The store manager's free list of slot numbers (``kvtier.store.backend`` says why it is
shared by every tier; here so that the serving build compiles it)."""

from __future__ import annotations


class SlotAllocator:
    """A free list of slot numbers ``0 .. num_slots - 1``, built lazily.

    Slots are handed out lowest-first on a fresh allocator and last-freed-first after, so
    recently used (warm) memory is reused. Memory grows with the slots in use, not with
    ``num_slots``: slots never handed out are the range from a high-water mark up, and only
    returned slots are kept in a list. Only the manager calls it, under its lock.

    >>> alloc = SlotAllocator(10**18)  # no list of 10**18 numbers is built
    >>> alloc.allocate_many(3), alloc.num_free == 10**18 - 3
    ([0, 1, 2], True)
    """

    __slots__ = ("_next", "_returned", "num_slots")

    def __init__(self, num_slots: int) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"a tier needs at least one slot, got num_slots={num_slots!r}")
        self.num_slots = num_slots
        self._next = 0
        """Slots ``_next ..`` have never been handed out."""
        self._returned: list[int] = []
        """Slots given back, the last freed on top."""

    @property
    def num_free(self) -> int:
        return len(self._returned) + self.num_slots - self._next

    def allocate(self) -> int:
        """A free slot number; the caller checked ``num_free`` first."""
        return self.allocate_many(1)[0]

    def allocate_many(self, n: int) -> list[int]:
        """``n`` free slot numbers, the last freed first; the caller checked ``num_free``."""
        assert 0 <= n <= self.num_free, f"allocate_many({n}) with {self.num_free} free"
        reused = min(n, len(self._returned))
        taken = self._returned[len(self._returned) - reused:]
        del self._returned[len(self._returned) - reused:]
        taken.reverse()
        fresh = n - reused
        taken += range(self._next, self._next + fresh)
        self._next += fresh
        return taken

    def free(self, slot: int) -> None:
        """Give ``slot`` back."""
        self._returned.append(slot)

    def free_many(self, slots: list[int]) -> None:
        """Give ``slots`` back."""
        self._returned.extend(slots)

    def free_slots(self) -> list[int]:
        """Every free slot number (for invariant checks: as long as the free capacity)."""
        return self._returned + list(range(self._next, self.num_slots))
