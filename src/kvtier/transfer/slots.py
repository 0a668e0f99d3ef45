"""The host side of a copy: slots, and the slab they are rows of.

A copy names its slot as a host tensor, a numpy array, a raw address, or a row of a slab
registered with the engine (``register_slab``: checked once, so a copy names a row by its
index and no tensor is built per copy). ``slot_addresses`` checks every slot of a job
against the bytes its chunk needs and returns the addresses the copiers use;
``allocate_slab`` makes a slab of ``num_slots`` rows, on 2 MiB pages where the platform
gives them (``huge_page_bytes``), so that a shuffled copy walks fewer page tables.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from kvtier.transfer.copies import Slot, SlotRef


def slot_addresses(
    slots: Sequence[SlotRef], need: np.ndarray, slab: torch.Tensor | None,
    rows: np.ndarray | None = None,
) -> tuple[list[torch.Tensor | int], np.ndarray]:
    """Every slot checked (``need[i]`` bytes for slot ``i``), and its address.

    A row index of the registered ``slab`` stays an int (its address is arithmetic: a job
    naming every slot so costs a few array operations); a buffer becomes a tensor as by
    :func:`slot_tensor`, the usual one (a row of a uint8 slab) after a short check of a few
    attribute reads. ``rows``: the slots as row indices, where the caller has read them so
    (every slot an int).
    """
    if slab is not None and (rows is not None or set(map(type, slots)) == {int}):
        indices = cast("list[int]", list(slots))
        if rows is None:
            try:
                rows = np.fromiter(indices, np.int64, len(indices))
            except OverflowError:  # an index past int64: no row either
                rows = np.array([r if -1 <= r < slab.shape[0] else -1 for r in indices],
                                np.int64)
        outside = np.flatnonzero((rows < 0) | (rows >= slab.shape[0]))
        if outside.size:
            i = int(outside[0])
            _slab_row(slab, indices[i], i)  # raises with the message
        return list(indices), slab.data_ptr() + rows * slab.stride(0)
    out: list[torch.Tensor] = []
    for i, s in enumerate(slots):
        if isinstance(s, torch.Tensor) and s.dtype is torch.uint8 and s.is_cpu \
                and s.stride() == (1,):
            out.append(s)
        elif type(s) is int:
            out.append(_slab_row(slab, s, i))
        else:
            out.append(slot_tensor(s, int(need[i]), i))  # type: ignore[arg-type]
    sizes = np.array([t.numel() for t in out], np.int64)
    short = np.flatnonzero(sizes < need)
    if short.size:
        i = int(short[0])
        slot_tensor(out[i], int(need[i]), i)  # raises with the message
    return list(out), np.array([t.data_ptr() for t in out], np.int64)


def _slab_row(slab: torch.Tensor | None, row: int, index: int) -> torch.Tensor:
    """Row ``row`` of the registered slab; ``ValueError`` if there is none or no such row."""
    if slab is None:
        raise ValueError(f"copy {index}: slot {row} is a slab row index, but no slab is "
                         "registered; pass TransferEngine(..., slab=rows) or a slot buffer")
    if not 0 <= row < slab.shape[0]:
        raise ValueError(f"copy {index}: slot {row} is not a row of the registered slab "
                         f"(it has {slab.shape[0]} rows)")
    return slab[row]


def register_slab(slab: torch.Tensor | np.ndarray, slot_bytes: int) -> torch.Tensor:
    """The slab copies may name rows of, as a ``[num_slots, row_bytes]`` uint8 CPU tensor.

    It must be 2-D, C-contiguous, uint8, writable host memory whose rows hold the layout's
    largest chunk (``slot_bytes``), and stay so (never resized) while the engine lives: row
    addresses are computed from it. Example: ``register_slab(allocate_slab(64, 4096,
    "cpu"), 4096)``.
    """
    slab = _host_bytes(slab, "slab registration", "slab", 2)
    if slab.shape[0] < 1 or slab.shape[1] < slot_bytes:
        raise ValueError(f"slab registration: rows of {slab.shape[1]} bytes cannot hold the "
                         f"largest chunk ({slot_bytes} bytes); allocate_slab(n, "
                         "engine.slot_bytes, device) makes one that fits")
    return slab


def slot_tensor(slot: Slot, need: int, index: int) -> torch.Tensor:
    """A 1-D uint8 CPU tensor sharing ``slot``'s memory, at least ``need`` bytes long.

    ``index`` (the copy's place in its job) only goes into error messages: ``copy 3: ...``.
    """
    slot = _host_bytes(slot, f"copy {index}", "slot", 1)
    if slot.numel() < need:
        raise ValueError(f"copy {index}: the slot holds {slot.numel()} bytes but the chunk "
                         f"needs {need}")
    return slot


def _host_bytes(obj: object, where: str, what: str, ndim: int) -> torch.Tensor:
    """``obj``, a torch tensor or numpy array, as an ``ndim``-D contiguous uint8 CPU tensor
    over the same memory (writable, for numpy); ``ValueError`` saying what is wrong else.

    Example: ``_host_bytes(np.zeros(8, np.uint8), "copy 0", "slot", 1)`` is an 8-byte
    tensor; a float array raises ``copy 0: a slot must be 1-D contiguous uint8, got ...``.
    """
    shape_rule = f"a {what} must be {ndim}-D contiguous uint8"
    if isinstance(obj, np.ndarray):
        if obj.dtype != np.uint8 or obj.ndim != ndim or not obj.flags.c_contiguous:
            raise ValueError(f"{where}: {shape_rule}, got {obj.dtype} with shape {obj.shape}")
        if not obj.flags.writeable:
            raise ValueError(f"{where}: the numpy {what} is read-only")
        obj = torch.from_numpy(obj)
    if not isinstance(obj, torch.Tensor):
        raise ValueError(f"{where}: a {what} must be a torch tensor or numpy array, "
                         f"got {type(obj).__name__}")
    if obj.dtype is not torch.uint8 or obj.dim() != ndim or not obj.is_contiguous():
        raise ValueError(f"{where}: {shape_rule}, got {obj.dtype} with shape "
                         f"{tuple(obj.shape)}")
    if not obj.is_cpu:
        raise ValueError(f"{where}: {what}s live in host memory, got a {what} on {obj.device}")
    return obj


def allocate_slab(num_slots: int, slot_bytes: int, device: torch.device | str) -> torch.Tensor:
    """A ``[num_slots, slot_bytes]`` uint8 host slab; page-locked when ``device`` is CUDA,
    else in 2 MiB pages where Linux gives them (:func:`huge_page_bytes`).

    Example: ``slab = allocate_slab(64, engine.slot_bytes, "cuda")``; ``slab[3]`` is slot 3.
    """
    device = torch.device(device)
    if num_slots < 1 or slot_bytes < 1:
        raise ValueError(f"allocate_slab: need positive sizes, got {num_slots} x {slot_bytes}")
    if device.type == "cuda":
        return torch.empty((num_slots, slot_bytes), dtype=torch.uint8, pin_memory=True)
    huge = huge_page_bytes(num_slots * slot_bytes)
    if huge is None:
        return torch.empty((num_slots, slot_bytes), dtype=torch.uint8)
    return huge.view(num_slots, slot_bytes)


HUGE_PAGE = 2 << 20


def huge_page_bytes(nbytes: int) -> torch.Tensor | None:
    """``nbytes`` of fresh, zeroed host memory that Linux backs with 2 MiB pages where it
    can (``MADV_HUGEPAGE`` before the first touch, from a 2 MiB boundary), or None where
    the system offers no such advice or ``nbytes`` is under one such page.

    Why: the native copier (:mod:`kvtier.transfer.native`) sweeps the engine's blocks in
    order and so writes and reads the slots scattered; with 4 KiB pages each scattered
    block of a large slab costs a page-table walk (two levels of them in a VM).
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or not hasattr(mmap, "MAP_ANONYMOUS") or nbytes < HUGE_PAGE:
        return None
    # private: a shared anonymous mapping is shmem, whose huge pages are a separate setting
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # a kernel without transparent huge pages
        region.madvise(advice)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # holds the mapping alive
    skip = -whole.data_ptr() % HUGE_PAGE
    return whole[skip : skip + nbytes]
