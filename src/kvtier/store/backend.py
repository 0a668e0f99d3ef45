"""What a tier gives the store manager: fixed-size slots, numbered ``0 .. num_slots - 1``.

The manager (``kvtier.store.manager.ChunkStore``) owns every slot number: it decides which
slot a chunk goes to, when a slot is free, and when its bytes are readable. A tier only
holds bytes. So a tier is small:

* ``SlotBackend``: ``num_slots``, ``slot_bytes``, ``read(slot, nbytes)``, ``write(slot, data)``.
  Host memory (``HostSlab``), and later local disk and Redis, implement it.
* ``ZeroCopyBackend``: a backend that also lends ``view(slot)``, a writable uint8 array over
  the slot's own memory, and ``rows()``, all of them as one array, so the data plane copies
  straight in and out (host memory).

``SlotAllocator`` is the manager's free list, here because any tier's slots are numbered the
same way (defined in ``kvtier.store.allocator``, which the serving build compiles: a store
calls it on every store and eviction).

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

from kvtier.store.allocator import SlotAllocator

__all__ = ["BytesLike", "SlotAllocator", "SlotBackend", "ZeroCopyBackend"]

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
