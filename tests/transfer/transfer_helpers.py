"""Small builders and a slow, obviously-correct oracle of the slot byte layout."""

from __future__ import annotations

import torch

from kvtier.transfer import ChunkCopy, GroupKV

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
if hasattr(torch, "float8_e4m3fn"):
    DTYPES.append(torch.float8_e4m3fn)


def kv_shape(axis: int, num_blocks: int, tokens: int, heads: int = 2, dim: int = 8) -> tuple:
    """``[num_blocks, 2, tokens, heads, dim]`` (axis 0) or ``[2, num_blocks, ...]`` (axis 1)."""
    if axis == 0:
        return (num_blocks, 2, tokens, heads, dim)
    return (2, num_blocks, tokens, heads, dim)


def random_tensor(shape: tuple, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random bytes viewed as ``dtype`` (every bit pattern, NaNs included: bytes compare)."""
    size = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def random_group(
    num_layers: int, axis: int, num_blocks: int, tokens: int, dtype: torch.dtype,
    gen: torch.Generator, **shape: int,
) -> GroupKV:
    layers = tuple(
        random_tensor(kv_shape(axis, num_blocks, tokens, **shape), dtype, gen)
        for _ in range(num_layers)
    )
    return GroupKV(layers, block_axis=axis)  # type: ignore[arg-type]


def block_bytes(layer: torch.Tensor, axis: int, block: int) -> torch.Tensor:
    """The documented bytes of one block of one layer: K part then V part."""
    if axis == 0:
        return layer[block].reshape(-1).view(torch.uint8)
    return torch.cat([layer[k, block].reshape(-1).view(torch.uint8) for k in range(layer.shape[0])])


def expected_slot(kv: GroupKV, blocks_per_slot: int, copy: ChunkCopy, fill: int) -> torch.Tensor:
    """Slot bytes after storing ``copy`` into a slot filled with ``fill``, built block by block."""
    parts = []
    for layer in kv.layers:
        for pos in range(blocks_per_slot):
            one = block_bytes(layer, kv.block_axis, 0)
            i = pos - copy.first_block
            if 0 <= i < copy.num_blocks:
                parts.append(block_bytes(layer, kv.block_axis, copy.block_ids[i]))
            else:
                parts.append(torch.full_like(one, fill))
    return torch.cat(parts)


def snapshot(kv: GroupKV) -> list[torch.Tensor]:
    return [t.clone() for t in kv.layers]


def blocks_equal(a: torch.Tensor, b: torch.Tensor, axis: int, ids_a: list[int],
                 ids_b: list[int]) -> bool:
    """Block ``ids_a[i]`` of ``a`` has the bytes of block ``ids_b[i]`` of ``b``, for every i."""
    return all(
        torch.equal(block_bytes(a, axis, x), block_bytes(b, axis, y))
        for x, y in zip(ids_a, ids_b, strict=True)
    )


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads included), for tensors of any dtype."""
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
