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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvtier import coverage
from kvtier.layout import Group, Layout
from kvtier.transfer.copies import GroupKV

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
