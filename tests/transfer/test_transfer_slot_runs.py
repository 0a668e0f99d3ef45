"""Slots that follow one another in memory move as one copy per run of them (the staged
path, CUDA's: one DMA per run instead of one per chunk); runs broken by a gap, slots that
only sit side by side in different storages and partial chunks move one by one. Every case
round-trips byte for byte."""

from __future__ import annotations

import pytest
import torch
from transfer_helpers import blocks_equal, random_group, snapshot

from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, TransferEngine, allocate_slab

LAYOUT = Layout((Group("full", tokens_per_block=2, blocks_per_chunk=3),))
ROWS = [0, 1, 2, 5, 6, 9, 11, 12]  # runs 0-2, 5-6, 9, 11-12 of a slab
FILL = 0x5A


class Seen:
    """A fault hook recording each copy's first block id; it fails the copy naming ``fail``."""

    def __init__(self, fail: int = -1) -> None:
        self.ids: list[int] = []
        self.fail = fail

    def __call__(self, copy: ChunkCopy) -> None:
        self.ids.append(copy.block_ids[0])
        if copy.block_ids[0] == self.fail:
            raise OSError("injected failure")


def _tables(n: int) -> list[tuple[int, ...]]:
    ids = torch.randperm(3 * n, generator=torch.Generator().manual_seed(3)).tolist()
    return [tuple(ids[3 * i : 3 * i + 3]) for i in range(n)]


@pytest.mark.parametrize("axis", [0, 1])
def test_slots_back_to_back_round_trip_exactly(axis: int) -> None:
    kv = random_group(2, axis, num_blocks=3 * len(ROWS), tokens=2, dtype=torch.bfloat16,
                      gen=torch.Generator().manual_seed(axis))
    original = snapshot(kv)
    chunk = TransferEngine(LAYOUT, [kv]).chunk_bytes(0)
    slab = allocate_slab(16, chunk, "cpu").fill_(FILL)  # rows exactly a chunk long
    tables = _tables(len(ROWS))
    copies = [ChunkCopy(0, slab[row], ids) for row, ids in zip(ROWS, tables, strict=True)]
    seen = Seen()
    with TransferEngine(LAYOUT, [kv], fault=seen) as engine:
        assert engine.wait(engine.submit_store(copies)).ok
        assert all(bool((slab[r] == FILL).all()) for r in range(16) if r not in ROWS)
        for t in kv.layers:
            t.zero_()
        assert engine.wait(engine.submit_load(copies)).ok
    assert sorted(seen.ids) == sorted(2 * [ids[0] for ids in tables])  # each copy, each job
    moved = [b for ids in tables for b in ids]
    for now, before in zip(kv.layers, original, strict=True):
        assert blocks_equal(now, before, axis, moved, moved)


def test_a_fault_inside_a_run_fails_the_job_before_its_bytes_move() -> None:
    kv = random_group(1, 0, num_blocks=3 * len(ROWS), tokens=2, dtype=torch.float16,
                      gen=torch.Generator().manual_seed(9))
    chunk = TransferEngine(LAYOUT, [kv]).chunk_bytes(0)
    slab = allocate_slab(16, chunk, "cpu").fill_(FILL)
    tables = _tables(len(ROWS))
    copies = [ChunkCopy(0, slab[row], ids) for row, ids in zip(ROWS, tables, strict=True)]
    with TransferEngine(LAYOUT, [kv], fault=Seen(fail=tables[1][0])) as engine:
        result = engine.wait(engine.submit_store(copies))
    assert not result.ok and isinstance(result.error, OSError)
    assert all(bool((slab[r] == FILL).all()) for r in ROWS[:3])  # its run never moved


def test_slots_side_by_side_in_separate_storages_move_one_by_one() -> None:
    """Two slots back to back in memory but each its own storage (``from_dlpack`` of two
    slab rows): a run never reaches past its first slot's storage."""
    kv = random_group(1, 0, num_blocks=6, tokens=2, dtype=torch.float16,
                      gen=torch.Generator().manual_seed(4))
    original = snapshot(kv)
    chunk = TransferEngine(LAYOUT, [kv]).chunk_bytes(0)
    base = allocate_slab(2, chunk, "cpu").fill_(FILL)
    first, second = torch.from_dlpack(base[0]), torch.from_dlpack(base[1])
    assert second.data_ptr() - first.data_ptr() == chunk  # side by side...
    assert first.untyped_storage().nbytes() == chunk  # ...in storages of one row each
    copies = [ChunkCopy(0, first, (0, 1, 2)), ChunkCopy(0, second, (3, 4, 5))]
    with TransferEngine(LAYOUT, [kv]) as engine:
        assert engine.wait(engine.submit_store(copies)).ok
        kv.layers[0].zero_()
        assert engine.wait(engine.submit_load(copies)).ok
    assert blocks_equal(kv.layers[0], original[0], 0, list(range(6)), list(range(6)))
