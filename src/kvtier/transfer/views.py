"""Byte views of registered KV tensors, checked once at registration.

Each layer tensor is viewed as *pieces*: 2-D word tensors ``[num_blocks, piece_words]``
whose row ``b`` is one contiguous part of block ``b``. A block-axis-0 layer is one piece
(the whole block); a block-axis-1 layer ``[2, num_blocks, ...]`` is two pieces (K, then V).
Copies move whole piece rows with ``index_select`` / ``index_copy_``, in the widest word
(8, 4, 2 or 1 bytes) that divides every row and offset of the group, since those kernels
move one word per element.

Example: fp16 ``[2, 100, 16, 1, 8]`` is two pieces of ``[100, 32]`` int64 words (256 bytes
each); in a slot, block ``b`` of this layer is the K piece's row then the V piece's row.
"""

from __future__ import annotations

import contextlib
import math
import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from kvtier import coverage
from kvtier.layout import Group, Layout
from kvtier.transfer.copies import GroupKV, Slot, SlotRef

_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


@dataclass(frozen=True)
class Piece:
    """Rows ``[num_blocks, width]`` (words) at word ``offset`` within a block's bytes."""

    rows: torch.Tensor
    offset: int

    @property
    def width(self) -> int:
        return int(self.rows.shape[1])

    @property
    def dense(self) -> bool:
        """Whether block ``b + 1`` starts right where block ``b`` ends, so that a run of
        blocks is one range: false for a recurrent state padded to a larger page."""
        return int(self.rows.stride(0)) == self.width


@dataclass(frozen=True)
class LayerView:
    """One layer: its pieces and where its region starts in a slot (in words)."""

    pieces: tuple[Piece, ...]
    words_per_block: int
    offset: int

    @property
    def runs(self) -> bool:
        """Whether runs of consecutive blocks move as one range (one dense piece)."""
        return len(self.pieces) == 1 and self.pieces[0].dense


@dataclass(frozen=True)
class GroupView:
    """One registered group, ready to copy.

    Example: 2 layers of 512-byte blocks, 4 blocks per slot, 8-byte words:
    ``chunk_words == 512``, layer 1 starts at word 256, and ``block_word(1, 2) == 384``.
    """

    index: int
    device: torch.device
    layers: tuple[LayerView, ...]
    num_blocks: int
    blocks_per_slot: int
    word_bytes: int

    @property
    def word(self) -> torch.dtype:
        return _WORDS[self.word_bytes]

    @property
    def chunk_words(self) -> int:
        return self.blocks_per_slot * sum(layer.words_per_block for layer in self.layers)

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_words * self.word_bytes

    def block_word(self, layer: int, block: int) -> int:
        """Word offset of chunk-relative ``block`` of ``layer`` within a slot."""
        view = self.layers[layer]
        return view.offset + block * view.words_per_block

    def byte_ranges(self, first: int, count: int) -> list[tuple[int, int]]:
        """Slot byte ranges holding blocks ``first .. first+count-1`` of every layer, merged.

        Example: 2 layers of 512-byte blocks, 4 per slot: blocks 3..3 are
        ``[(1536, 2048), (3584, 4096)]``; blocks 0..3 are ``[(0, 4096)]``.
        """
        out: list[tuple[int, int]] = []
        for i, view in enumerate(self.layers):
            lo = self.block_word(i, first) * self.word_bytes
            hi = lo + count * view.words_per_block * self.word_bytes
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
        return out


def build_views(
    layout: Layout, kv: Sequence[GroupKV]
) -> tuple[tuple[GroupView, ...], torch.device]:
    """Check a registration against the layout; return one view per group and the device."""
    kv = list(kv)
    if len(kv) != len(layout.groups):
        raise ValueError(
            f"registration: the layout has {len(layout.groups)} groups but {len(kv)} GroupKV "
            "were given; pass one GroupKV per group, in layout order"
        )
    device = _common_device(kv)
    pairs = enumerate(zip(layout.groups, kv, strict=True))
    views = tuple(_group_view(i, group, k) for i, (group, k) in pairs)
    return views, device


def _common_device(kv: Sequence[GroupKV]) -> torch.device:
    tensors = [t for k in kv for t in k.layers]
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"registration: layers must be torch tensors, got {type(t).__name__}")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"registration: all KV tensors must be on one device, got {devices}")
    if not devices:
        raise ValueError("registration: every group needs at least one layer tensor")
    return devices.pop()


def _group_view(index: int, group: Group, kv: GroupKV) -> GroupView:
    where = f"registration of group {index} ({group.label})"
    if not isinstance(kv, GroupKV):
        raise ValueError(f"{where}: expected a GroupKV, got {type(kv).__name__}")
    if not kv.layers:
        raise ValueError(f"{where}: needs at least one layer tensor")
    for i, t in enumerate(kv.layers):
        _check_layer(where, i, t, group, kv)
    num_blocks = _num_blocks(where, kv)
    block_bytes = [_layer_block_bytes(t, kv.block_axis) for t in kv.layers]
    _check_bytes(where, group, block_bytes)
    word_bytes = _word_bytes(kv, block_bytes)
    layers, offset = [], 0
    blocks_per_slot = coverage.blocks_per_slot(group)
    for t, nbytes in zip(kv.layers, block_bytes, strict=True):
        words = nbytes // word_bytes
        layers.append(LayerView(_pieces(t, kv.block_axis, word_bytes), words, offset))
        offset += words * blocks_per_slot
    device = kv.layers[0].device
    return GroupView(index, device, tuple(layers), num_blocks, blocks_per_slot, word_bytes)


def _check_layer(where: str, i: int, t: torch.Tensor, group: Group, kv: GroupKV) -> None:
    if not t.is_contiguous():
        if group.kind != "state":
            raise ValueError(f"{where}: layer {i} is not contiguous; register the tensor itself")
        _check_state(where, i, t, kv)
        return
    need = kv.block_axis + 2
    if t.dim() < need:
        raise ValueError(
            f"{where}: layer {i} has shape {tuple(t.shape)}; block axis {kv.block_axis} "
            f"needs at least {need} dimensions"
        )
    if group.kind == "state":
        return
    if not 0 <= kv.token_axis < t.dim() or kv.token_axis == kv.block_axis:
        raise ValueError(f"{where}: token_axis {kv.token_axis} is not valid for shape "
                         f"{tuple(t.shape)} with block axis {kv.block_axis}")
    if t.shape[kv.token_axis] != group.tokens_per_block:
        raise ValueError(
            f"{where}: layer {i} has {t.shape[kv.token_axis]} tokens per block at axis "
            f"{kv.token_axis} (shape {tuple(t.shape)}) but the layout says tokens_per_block="
            f"{group.tokens_per_block}"
        )


def _check_state(where: str, i: int, t: torch.Tensor, kv: GroupKV) -> None:
    """A state tensor that is not contiguous must be ``[num_blocks, ...]`` in pages larger
    than the state (vLLM pads a state page to the attention page size): each block's state
    contiguous, and blocks evenly spaced at least that far apart."""
    if kv.block_axis != 0 or t.dim() < 2:
        raise ValueError(f"{where}: state tensor {i} must be [num_blocks, ...] (block axis 0), "
                         f"got shape {tuple(t.shape)} with block axis {kv.block_axis}")
    if not t[0].is_contiguous() or t.stride(0) < t[0].numel():
        raise ValueError(
            f"{where}: state tensor {i} (shape {tuple(t.shape)}, strides {t.stride()}) does "
            "not hold each block's state contiguously in pages of their own")


def _num_blocks(where: str, kv: GroupKV) -> int:
    counts = [int(t.shape[kv.block_axis]) for t in kv.layers]
    if len(set(counts)) != 1:
        raise ValueError(
            f"{where}: layers have different num_blocks {counts} at axis {kv.block_axis}; "
            "a group shares one block table"
        )
    return counts[0]


def _layer_block_bytes(t: torch.Tensor, block_axis: int) -> int:
    return t.numel() * t.element_size() // int(t.shape[block_axis])


def _check_bytes(where: str, group: Group, block_bytes: list[int]) -> None:
    total = sum(block_bytes)
    if group.kind == "state":
        if group.bytes_per_state is not None and total != group.bytes_per_state:
            raise ValueError(
                f"{where}: layers hold {total} bytes per state {block_bytes} but the layout "
                f"says bytes_per_state={group.bytes_per_state}"
            )
        return
    want = group.bytes_per_block
    if want is not None and total != want:
        raise ValueError(
            f"{where}: layers hold {total / group.tokens_per_block:g} bytes per token "
            f"(per layer per block: {block_bytes}) but the layout says bytes_per_token="
            f"{group.bytes_per_token}"
        )


def _word_bytes(kv: GroupKV, block_bytes: list[int]) -> int:
    """The widest word dividing every row size, block spacing and tensor's address."""
    sizes = list(block_bytes)
    sizes += [_block_stride_bytes(t, kv.block_axis) for t in kv.layers]
    if kv.block_axis == 1:
        sizes += [b // int(t.shape[0]) for t, b in zip(kv.layers, block_bytes, strict=True)]
    sizes += [t.data_ptr() for t in kv.layers]
    g = math.gcd(*sizes)
    return next(w for w in (8, 4, 2, 1) if g % w == 0)


def _block_stride_bytes(t: torch.Tensor, block_axis: int) -> int:
    return int(t.stride(block_axis)) * t.element_size()


def _pieces(t: torch.Tensor, block_axis: int, word_bytes: int) -> tuple[Piece, ...]:
    word = _WORDS[word_bytes]
    if not t.is_contiguous():  # a state in padded pages (``_check_state``)
        return (Piece(_page_rows(t).view(word), 0),)
    raw = _bytes_of(t)
    if block_axis == 0:
        return (Piece(raw.reshape(t.shape[0], -1).view(word), 0),)
    lead = raw.reshape(t.shape[0], t.shape[1], -1)
    width = lead.shape[2] // word_bytes
    return tuple(Piece(lead[k].view(word), k * width) for k in range(lead.shape[0]))


def _page_rows(t: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, state bytes]`` uint8 rows over ``t``'s memory, one per page: row ``b``
    is block ``b``'s state, the page's padding left out. Example: a bf16 ``[113, 3, 1024]``
    conv state in 294912-byte pages -> rows of 6144 bytes, 294912 bytes apart."""
    size = t.element_size()
    flat = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    shape = (int(t.shape[0]), t[0].numel() * size)
    return flat.as_strided(shape, (int(t.stride(0)) * size, 1), t.storage_offset() * size)


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """``t``'s storage as a flat uint8 tensor (any dtype, including fp8 and bool)."""
    return t.reshape(-1).view(torch.uint8)


def slot_addresses(
    slots: Sequence[SlotRef], need: np.ndarray, slab: torch.Tensor | None
) -> tuple[list[torch.Tensor | int], np.ndarray]:
    """Every slot checked (``need[i]`` bytes for slot ``i``), and its address.

    A row index of the registered ``slab`` stays an int (its address is arithmetic: a job
    naming every slot so costs a few array operations); a buffer becomes a tensor as by
    :func:`slot_tensor`, the usual one (a row of a uint8 slab) after a short check of a few
    attribute reads.
    """
    if slab is not None and set(map(type, slots)) == {int}:  # one pass in C
        indices = cast("list[int]", list(slots))
        try:
            rows = np.fromiter(indices, np.int64, len(indices))
        except OverflowError:  # an index past int64: no row either
            rows = np.array([r if -1 <= r < slab.shape[0] else -1 for r in indices], np.int64)
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
