"""The host-memory tier: one preallocated slab of fixed-size slots.

The slab is allocated once, as ``num_slots * slot_bytes`` bytes, and never grows: a chunk
is a slot, and slot ``i`` is bytes ``[i * slot_bytes, (i + 1) * slot_bytes)``. The slot size
is the layout's largest chunk (``Layout.max_bytes_per_chunk``), so every group's chunks fit;
a smaller chunk uses the start of its slot.

A slot outlives its chunks, and a slot leaves host memory whole (write-back copies the slot
to the next tier). So that a shorter chunk never carries the end of the slot's previous
chunk (perhaps another tenant's) down with it, the store zeroes a slot as it frees it
(``clear``): every free slot is zero past the smallest chunk the slab holds, and a chunk
written into it overwrites everything before that. ``for_layout`` knows the smallest
chunk, so where every group's chunk fills the slot, clearing costs nothing.

When a CUDA device is present (and torch is installed) the slab is page-locked, so that
copies to and from the accelerator can run asynchronously; otherwise it is plain numpy
memory. Either way ``view(slot)`` is a zero-copy ``uint8`` numpy array over the slot and
``tensor(slot)`` the same memory as a torch tensor.

>>> slab = HostSlab(num_slots=4, slot_bytes=8, pin_memory=False)
>>> slab.write(2, b"abc")
>>> slab.read(2, 3), slab.view(2)[:3].tobytes(), slab.nbytes
(b'abc', b'abc', 32)
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from kvtier.layout import Layout
from kvtier.store.admission import Admission
from kvtier.store.backend import BytesLike
from kvtier.store.manager import ChunkStore

if TYPE_CHECKING:
    import torch


def cuda_available() -> bool:
    """True when torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def slots_for_capacity(capacity_bytes: int, slot_bytes: int) -> int:
    """How many whole slots fit in ``capacity_bytes``; ValueError if not even one.

    >>> slots_for_capacity(10_000, 4096)
    2
    """
    for name, value in (("capacity_bytes", capacity_bytes), ("slot_bytes", slot_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if capacity_bytes < slot_bytes:
        raise ValueError(
            f"capacity of {capacity_bytes} bytes is smaller than one slot ({slot_bytes} bytes, "
            f"the layout's largest chunk): give at least {slot_bytes} bytes"
        )
    return capacity_bytes // slot_bytes


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX sysconf name here
        return None


def check_fits_memory(nbytes: int, what: str) -> None:
    """ValueError, before allocating, if ``nbytes`` is more than this machine's memory.

    >>> check_fits_memory(2**50, "host slab")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: host slab of 1048576.0 GiB is more than this machine's memory (...); give...
    """
    total = physical_memory()
    if total is not None and nbytes > total:
        raise ValueError(f"{what} of {nbytes / 2**30:.1f} GiB is more than this machine's "
                         f"memory ({total / 2**30:.1f} GiB); give a smaller size")


HUGE_PAGE = 2 << 20


def huge_page_zeros(nbytes: int) -> npt.NDArray[np.uint8]:
    """``nbytes`` zeroed bytes that Linux backs with 2 MiB pages where it can
    (``MADV_HUGEPAGE`` on a private anonymous mapping before the first touch, from a 2 MiB
    boundary); elsewhere, and under one such page, plain ``np.zeros``.

    Why: the native copier sweeps the engine's blocks in order and so reaches the slots
    scattered (kvtier.transfer.native); with 4 KiB pages each scattered block of a large
    slab costs a page-table walk. (``kvtier.transfer.slots.huge_page_bytes`` is the same
    for torch; the rooms do not import each other.)
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or not hasattr(mmap, "MAP_ANONYMOUS") or nbytes < HUGE_PAGE:
        return np.zeros(nbytes, dtype=np.uint8)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # a kernel without transparent huge pages
        region.madvise(advice)
    whole = np.frombuffer(region, dtype=np.uint8)  # holds the mapping alive
    skip = -whole.ctypes.data % HUGE_PAGE
    return whole[skip : skip + nbytes]


class HostSlab:
    """``num_slots`` slots of ``slot_bytes`` bytes in one preallocated host buffer.

    ``pin_memory``: page-lock the slab (needs torch and a CUDA device); ``None`` (the
    default) pins exactly when a CUDA device is present.
    """

    def __init__(self, num_slots: int, slot_bytes: int, *, pin_memory: bool | None = None,
                 min_chunk_bytes: int = 0):
        for name, value in (("num_slots", num_slots), ("slot_bytes", slot_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"host slab: {name} must be a positive integer, got {value!r}")
        if not 0 <= min_chunk_bytes <= slot_bytes:
            raise ValueError(f"host slab: min_chunk_bytes must be in [0, {slot_bytes}], got "
                             f"{min_chunk_bytes!r}")
        self.min_chunk_bytes = min_chunk_bytes
        """Every chunk written into a slot is at least this long: ``clear`` zeroes only
        past it (0, the default: the whole slot)."""
        if pin_memory is None:
            pin_memory = cuda_available()
        elif pin_memory and not cuda_available():
            raise ValueError("host slab: pin_memory=True needs torch and a CUDA device")
        self._num_slots = num_slots
        self._slot_bytes = slot_bytes
        self.pinned: bool = pin_memory
        self._tensor: torch.Tensor | None = None
        check_fits_memory(num_slots * slot_bytes,
                          f"host slab ({num_slots} slots of {slot_bytes} bytes)")
        self._array = self._allocate(num_slots * slot_bytes, pin_memory)

    @classmethod
    def for_layout(
        cls, layout: Layout, capacity_bytes: int, *, pin_memory: bool | None = None
    ) -> HostSlab:
        """As many slots of the layout's largest chunk as fit in ``capacity_bytes``."""
        slot_bytes = layout.max_bytes_per_chunk
        if slot_bytes is None:
            raise ValueError(
                "host slab: the layout gives no chunk sizes; set bytes_per_token (or "
                "bytes_per_state) on every group"
            )
        num_slots = slots_for_capacity(capacity_bytes, slot_bytes)
        smallest = min(g.bytes_per_chunk or 0 for g in layout.groups)
        return cls(num_slots, slot_bytes, pin_memory=pin_memory, min_chunk_bytes=smallest)

    def _allocate(self, nbytes: int, pin: bool) -> npt.NDArray[np.uint8]:
        if not pin:
            return huge_page_zeros(nbytes)
        import torch

        self._tensor = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)
        return self._tensor.numpy()

    @property
    def num_slots(self) -> int:
        return self._num_slots

    @property
    def slot_bytes(self) -> int:
        return self._slot_bytes

    @property
    def nbytes(self) -> int:
        """Size of the whole slab."""
        return self._num_slots * self._slot_bytes

    def _span(self, slot: int) -> slice:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self._num_slots:
            raise ValueError(
                f"host slab: slot must be an int in [0, {self._num_slots}), got {slot!r}"
            )
        start = slot * self._slot_bytes
        return slice(start, start + self._slot_bytes)

    def view(self, slot: int) -> npt.NDArray[np.uint8]:
        """A writable ``uint8`` numpy view of ``slot`` (no copy).

        >>> slab = HostSlab(2, 4, pin_memory=False)
        >>> slab.view(1)[:] = 7; slab.read(1)
        b'\\x07\\x07\\x07\\x07'
        """
        return self._array[self._span(slot)]

    def rows(self) -> npt.NDArray[np.uint8] | torch.Tensor:
        """The whole slab as ``[num_slots, slot_bytes]`` (no copy): the pinned tensor when
        page-locked, else the numpy array; what ``TransferEngine(..., slab=...)`` takes.

        >>> HostSlab(3, 8, pin_memory=False).rows().shape
        (3, 8)
        """
        if self._tensor is not None:
            return self._tensor.view(self._num_slots, self._slot_bytes)
        return self._array.reshape(self._num_slots, self._slot_bytes)

    def tensor(self, slot: int) -> torch.Tensor:
        """``view(slot)`` as a torch ``uint8`` tensor over the same memory (needs torch)."""
        import torch

        if self._tensor is not None:
            return self._tensor[self._span(slot)]
        return torch.from_numpy(self.view(slot))

    def read(self, slot: int, nbytes: int | None = None) -> bytes:
        """A copy of the first ``nbytes`` bytes of ``slot`` (the whole slot by default)."""
        view = self.view(slot)
        if nbytes is None:
            return view.tobytes()
        if not 0 <= nbytes <= self._slot_bytes:
            raise ValueError(f"host slab: nbytes must be in [0, {self._slot_bytes}], got {nbytes}")
        return view[:nbytes].tobytes()

    def write(self, slot: int, data: BytesLike) -> None:
        """Copy ``data`` (at most ``slot_bytes`` bytes) to the start of ``slot``."""
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)  # type: ignore[arg-type]
        if raw.size > self._slot_bytes:
            raise ValueError(
                f"host slab: {raw.size} bytes do not fit in a {self._slot_bytes}-byte slot"
            )
        self.view(slot)[: raw.size] = raw

    def clear(self, slot: int) -> None:
        """Zero ``slot`` past ``min_chunk_bytes`` (module docstring), as it is freed.

        >>> slab = HostSlab(1, 4, pin_memory=False, min_chunk_bytes=1)
        >>> slab.write(0, b"abcd"); slab.clear(0); slab.read(0)
        b'a\\x00\\x00\\x00'
        """
        self.view(slot)[self.min_chunk_bytes :] = 0


def host_store(
    layout: Layout, capacity_bytes: int, *, policy: str = "lru",
    pin_memory: bool | None = None, admission: Admission | None = None,
) -> ChunkStore:
    """A ``ChunkStore`` over a new ``HostSlab`` of ``capacity_bytes // slot_bytes`` slots."""
    slab = HostSlab.for_layout(layout, capacity_bytes, pin_memory=pin_memory)
    return ChunkStore(backend=slab, policy=policy, admission=admission)
