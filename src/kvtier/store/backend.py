"""What a tier gives the store manager: fixed-size slots, numbered ``0 .. num_slots - 1``.

The manager (``kvtier.store.manager.ChunkStore``) owns every slot number: it decides which
slot a chunk goes to, when a slot is free, and when its bytes are readable. A tier only
holds bytes. So a tier is small:

* ``SlotBackend``: ``num_slots``, ``slot_bytes``, ``read(slot, nbytes)``, ``write(slot, data)``.
  Host memory (``HostSlab``), and later local disk and Redis, implement it.
* ``ZeroCopyBackend``: a backend that also lends ``view(slot)``, a writable uint8 array over
  the slot's own memory, and ``rows()``, all of them as one array, so the data plane copies
  straight in and out (host memory).

``SlotAllocator`` is the manager's free list; it lives here because any tier's slots are
numbered the same way.

>>> alloc = SlotAllocator(3)
>>> alloc.allocate(), alloc.allocate(), alloc.num_free
(0, 1, 1)
>>> alloc.free(0); alloc.allocate()
0
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

BytesLike = bytes | bytearray | memoryview | npt.NDArray[np.uint8]


@runtime_checkable
class SlotBackend(Protocol):
    """Bytes of ``num_slots`` slots of ``slot_bytes`` each; the manager numbers them."""

    @property
    def num_slots(self) -> int:
        """How many slots the tier holds."""
        ...

    @property
    def slot_bytes(self) -> int:
        """Bytes per slot: the layout's largest chunk."""
        ...

    def read(self, slot: int, nbytes: int | None = None) -> bytes:
        """A copy of the first ``nbytes`` bytes of ``slot`` (the whole slot by default)."""
        ...

    def write(self, slot: int, data: BytesLike) -> None:
        """Write ``data`` (at most ``slot_bytes`` bytes) at the start of ``slot``."""
        ...


@runtime_checkable
class ZeroCopyBackend(SlotBackend, Protocol):
    """A backend whose slots are addressable memory, lent as views for the data plane."""

    def view(self, slot: int) -> npt.NDArray[np.uint8]:
        """A writable ``uint8`` array of ``slot_bytes`` over the slot's memory (no copy)."""
        ...

    def rows(self) -> Any:
        """Every slot at once: a writable ``[num_slots, slot_bytes]`` uint8 array, row ``i``
        being slot ``i`` (no copy); a torch tensor where the memory is torch's (pinned)."""
        ...


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
