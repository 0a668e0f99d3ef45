"""Recurrent states in pages larger than the state, as vLLM lays them out: each layer's
conv and SSM (or delta-net) state tensors are ``[num_blocks, ...]`` views into one buffer of
pages padded to the attention page size. Only the states' own bytes move, and the padding
of a destination page is never written."""

from __future__ import annotations

import pytest
import torch

from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, GroupKV, TransferEngine, allocate_slab

PAGE = 1024
"""Bytes of one padded page: a 96-byte conv state and a 512-byte SSM state fit in it."""
NUM_BLOCKS = 8


def padded_state_layer(gen: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One layer's buffer of ``NUM_BLOCKS`` pages and its two state views (bf16 conv
    ``[3, 16]`` at byte 0 of a page, fp32 SSM ``[2, 8, 8]`` right after it)."""
    raw = torch.randint(0, 256, (NUM_BLOCKS * PAGE,), dtype=torch.uint8, generator=gen)
    conv = torch.as_strided(raw.view(torch.bfloat16), (NUM_BLOCKS, 3, 16), (PAGE // 2, 16, 1))
    ssm = torch.as_strided(raw.view(torch.float32), (NUM_BLOCKS, 2, 8, 8),
                           (PAGE // 4, 64, 8, 1), 96 // 4)
    return raw, [conv, ssm]


def page(raw: torch.Tensor, block: int) -> torch.Tensor:
    return raw[block * PAGE : (block + 1) * PAGE].clone()


@pytest.mark.parametrize("slab_rows", [True, False])
def test_a_padded_state_moves_without_its_padding(slab_rows: bool) -> None:
    gen = torch.Generator().manual_seed(27)
    layers = [padded_state_layer(gen) for _ in range(2)]
    tensors = tuple(t for _, views in layers for t in views)
    group = Group("state", 16, 1, bytes_per_state=2 * (96 + 512))
    with TransferEngine(Layout((group,)), [GroupKV(tensors)]) as engine:
        assert engine.chunk_bytes(0) == 2 * 608  # the states, not two 1024-byte pages
        slab = allocate_slab(2, engine.slot_bytes + 16, engine.device).fill_(0xAB)
        slot = slab[0] if slab_rows else slab[0].clone()
        before = [page(raw, 5) for raw, _ in layers]
        assert engine.wait(engine.submit_store(ChunkCopy(0, slot, (2,)))).ok
        want = torch.cat([page(raw, 2)[:608] for raw, _ in layers])
        assert torch.equal(slot[: 2 * 608], want)
        assert bool((slot[2 * 608 :] == 0xAB).all())  # nothing past the chunk
        assert engine.wait(engine.submit_load(ChunkCopy(0, slot, (5,)))).ok
    for (raw, _), old in zip(layers, before, strict=True):
        assert torch.equal(page(raw, 5)[:608], page(raw, 2)[:608])
        assert torch.equal(page(raw, 5)[608:], old[608:])  # the padding is left alone


def test_state_pages_that_overlap_are_refused() -> None:
    raw = torch.zeros(NUM_BLOCKS * 64 + 64, dtype=torch.float32)
    squeezed = torch.as_strided(raw, (NUM_BLOCKS, 128), (64, 1))  # blocks 512 bytes apart
    group = Group("state", 16, 1, bytes_per_state=512)
    with pytest.raises(ValueError, match="pages of their own"):
        TransferEngine(Layout((group,)), [GroupKV((squeezed,))])


def test_states_of_consecutive_blocks_in_one_job() -> None:
    """Blocks 2 and 3 into consecutive slab rows in one job, then into blocks 6 and 7: a run
    of state blocks is moved page by page (their pages are not one range)."""
    gen = torch.Generator().manual_seed(28)
    raw, views = padded_state_layer(gen)
    group = Group("state", 16, 1, bytes_per_state=608)
    with TransferEngine(Layout((group,)), [GroupKV(tuple(views))]) as engine:
        slab = allocate_slab(2, engine.slot_bytes, engine.device)
        stores = [ChunkCopy(0, slab[0], (2,)), ChunkCopy(0, slab[1], (3,))]
        assert engine.wait(engine.submit_store(stores)).ok
        assert torch.equal(slab[1][:608], page(raw, 3)[:608])
        loads = [ChunkCopy(0, slab[0], (6,)), ChunkCopy(0, slab[1], (7,))]
        assert engine.wait(engine.submit_load(loads)).ok
    assert torch.equal(page(raw, 6)[:608], page(raw, 2)[:608])
    assert torch.equal(page(raw, 7)[:608], page(raw, 3)[:608])
