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
    """A free list of slot numbers ``0 .. num_slots - 1``.

    Slots are handed out lowest-first on a fresh allocator and last-freed-first after, so
    recently used (warm) memory is reused. Only the manager calls it, under its lock.
    """

    __slots__ = ("_free", "num_slots")

    def __init__(self, num_slots: int) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"a tier needs at least one slot, got num_slots={num_slots!r}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """A free slot number; the caller checked ``num_free`` first."""
        assert self._free, "allocate() on a full allocator: the manager must make room first"
        return self._free.pop()

    def allocate_many(self, n: int) -> list[int]:
        """``n`` free slot numbers; the caller checked ``num_free`` first."""
        assert 0 <= n <= len(self._free), f"allocate_many({n}) with {len(self._free)} free"
        if n == 0:
            return []
        taken = self._free[-n:]
        del self._free[-n:]
        taken.reverse()
        return taken

    def free(self, slot: int) -> None:
        """Give ``slot`` back."""
        self._free.append(slot)

    def free_many(self, slots: list[int]) -> None:
        """Give ``slots`` back."""
        self._free.extend(slots)

    def free_slots(self) -> list[int]:
        """A copy of the free list (for invariant checks)."""
        return list(self._free)
