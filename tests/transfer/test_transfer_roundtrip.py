"""Round trips: engine blocks -> slots -> engine blocks, byte for byte, against an oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transfer_helpers import (
    DTYPES,
    blocks_equal,
    expected_slot,
    random_group,
    random_tensor,
    same_bytes,
    snapshot,
)

from kvtier.coverage import load_set
from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, GroupKV, TransferEngine, allocate_slab

FILL = 0xAB


def engine_for(layout: Layout, kv: list[GroupKV], **kw: object) -> TransferEngine:
    return TransferEngine(layout, kv, **kw)  # type: ignore[arg-type]


SLOT_KINDS = ["slab", "separate", "uneven"]


def make_slots(engine: TransferEngine, num_slots: int, kind: str = "slab") -> list[torch.Tensor]:
    """Slots filled with FILL, 64 bytes larger than the largest chunk.

    ``slab``: consecutive rows of one slab (moved in one pass, no staging); ``separate``:
    one tensor each, and ``uneven``: rows 0, 1, 3, 4, 6, ... of a slab (both through
    staging when a batch has more than one copy).
    """
    size = engine.slot_bytes + 64
    if kind == "separate":
        return [torch.full((size,), FILL, dtype=torch.uint8) for _ in range(num_slots)]
    rows = [i + i // 2 for i in range(num_slots)] if kind == "uneven" else range(num_slots)
    slab = allocate_slab(2 * num_slots, size, engine.device).fill_(FILL)
    return [slab[i] for i in rows]


@pytest.mark.parametrize("kind", SLOT_KINDS)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_store_then_load_restores_exact_bytes(axis: int, dtype: torch.dtype, kind: str) -> None:
    gen = torch.Generator().manual_seed(1)
    layout = Layout((Group("full", tokens_per_block=4, blocks_per_chunk=3),))
    kv = random_group(3, axis, num_blocks=20, tokens=4, dtype=dtype, gen=gen)
    original = snapshot(kv)
    tables = [[3, 17, 5], [0, 1, 2], [19, 8, 11]]
    with engine_for(layout, [kv]) as engine:
        slab = make_slots(engine, 3, kind)
        copies = [ChunkCopy(0, slab[i], ids) for i, ids in enumerate(tables)]
        assert engine.wait(engine.submit_store(copies)).ok
        for i, copy in enumerate(copies):
            n = engine.chunk_bytes(0)
            assert torch.equal(slab[i][:n], expected_slot(kv, 3, copy, FILL))
            assert bool((slab[i][n:] == FILL).all()), "bytes past the chunk were written"
        for t in kv.layers:
            t.reshape(-1).view(torch.uint8).zero_()
        assert engine.wait(engine.submit_load(copies)).ok
    moved = [b for ids in tables for b in ids]
    untouched = sorted(set(range(20)) - set(moved))
    for now, before in zip(kv.layers, original, strict=True):
        assert blocks_equal(now, before, axis, moved, moved)
        rest = _blocks(now, axis, untouched)
        zeros = [not block.reshape(-1).view(torch.uint8).any() for block in rest]
        assert all(zeros), "a block outside the job was written"


def _blocks(t: torch.Tensor, axis: int, ids: list[int]) -> list[torch.Tensor]:
    return [t[b] if axis == 0 else t[:, b] for b in ids]


@pytest.mark.parametrize("kind", SLOT_KINDS)
def test_load_into_other_blocks_moves_kv_between_block_ids(kind: str) -> None:
    gen = torch.Generator().manual_seed(2)
    layout = Layout((Group("full", tokens_per_block=2, blocks_per_chunk=2),))
    kv = random_group(2, 0, num_blocks=10, tokens=2, dtype=torch.bfloat16, gen=gen)
    original = snapshot(kv)
    with engine_for(layout, [kv]) as engine:
        slab = make_slots(engine, 1, kind)
        assert engine.wait(engine.submit_store(ChunkCopy(0, slab[0], (1, 2)))).ok
        assert engine.wait(engine.submit_load(ChunkCopy(0, slab[0], (7, 4)))).ok
    for now, before in zip(kv.layers, original, strict=True):
        assert blocks_equal(now, before, 0, [7, 4], [1, 2])
        assert blocks_equal(now, before, 0, [0, 3, 5, 6, 8, 9], [0, 3, 5, 6, 8, 9])


def hybrid_layout() -> tuple[Layout, list[GroupKV]]:
    """Full attention (16-token blocks), sliding window (4-token blocks, 4 per chunk), state."""
    gen = torch.Generator().manual_seed(3)
    layout = Layout((
        Group("full", 16, 1, bytes_per_token=2 * (2 * 2 * 8 * 2)),
        Group("sliding_window", 4, 4, window=8, bytes_per_token=3 * (2 * 1 * 8 * 4)),
        Group("state", 16, 1, bytes_per_state=2 * 24 * 2),
    ))
    kv = [
        random_group(2, 1, num_blocks=12, tokens=16, dtype=torch.bfloat16, gen=gen),
        random_group(3, 0, num_blocks=40, tokens=4, dtype=torch.float32, gen=gen, heads=1),
        GroupKV(tuple(random_tensor((9, 4, 6), torch.float16, gen) for _ in range(2))),
    ]
    return layout, kv


@pytest.mark.parametrize("kind", SLOT_KINDS)
def test_groups_with_different_block_sizes_share_one_job_and_one_slab(kind: str) -> None:
    layout, kv = hybrid_layout()
    originals = [snapshot(k) for k in kv]
    with engine_for(layout, kv) as engine:
        assert engine.slot_bytes == layout.max_bytes_per_chunk == engine.chunk_bytes(1) == 3072
        slab = make_slots(engine, 4, kind)
        numpy_slot = np.full(engine.slot_bytes, FILL, dtype=np.uint8)
        copies = [
            ChunkCopy(0, slab[0], (5,)), ChunkCopy(1, slab[1], (9, 3, 30, 31)),
            ChunkCopy(1, numpy_slot, (0, 1, 2, 39)), ChunkCopy(2, slab[2], (8,)),
        ]
        assert engine.wait(engine.submit_store(copies)).ok
        assert torch.equal(torch.from_numpy(numpy_slot)[:3072],
                           expected_slot(kv[1], 4, copies[2], FILL))
        for k in kv:
            for t in k.layers:
                t.zero_()
        assert engine.wait(engine.submit_load(copies)).ok
    for copy in copies:
        group = kv[copy.group]
        for now, before in zip(group.layers, originals[copy.group], strict=True):
            ids = list(copy.block_ids)
            assert blocks_equal(now, before, group.block_axis, ids, ids)


@pytest.mark.parametrize("kind", SLOT_KINDS)
def test_partial_block_run_loads_only_live_blocks(kind: str) -> None:
    """Sliding window 8, E=5, 2-token blocks, 8-token chunks, hit at 24: retained [12, 24),
    so chunk 1 from its block 2 on (request blocks 6, 7), then chunk 2 whole."""
    gen = torch.Generator().manual_seed(4)
    group = Group("sliding_window", 2, 4, window=8, extra_retained=5)
    runs = load_set(group, 24)
    assert [(r.chunk, r.first_block, r.num_blocks) for r in runs] == [(1, 2, 2), (2, 0, 4)]
    kv = random_group(2, 1, num_blocks=16, tokens=2, dtype=torch.float16, gen=gen)
    original = snapshot(kv)
    table = list(range(15, 3, -1))  # request block i lives in engine block table[i]
    with engine_for(Layout((group,)), [kv]) as engine:
        slab = make_slots(engine, 3, kind)
        stores = [ChunkCopy(0, slab[c], table[4 * c : 4 * c + 4]) for c in range(3)]
        assert engine.wait(engine.submit_store(stores)).ok
        for t in kv.layers:
            t.view(torch.int16).fill_(-1)
        loads = [engine.copy_for_run(0, slab[r.chunk], r, table) for r in runs]
        assert [(c.block_ids, c.first_block) for c in loads] == [((9, 8), 2), ((7, 6, 5, 4), 0)]
        assert engine.wait(engine.submit_load(loads)).ok
    live = [9, 8, 7, 6, 5, 4]
    dead = [b for b in range(16) if b not in live]
    for now, before in zip(kv.layers, original, strict=True):
        assert blocks_equal(now, before, 1, live, live)
        assert all(bool((blk.view(torch.int16) == -1).all()) for blk in _blocks(now, 1, dead))


@pytest.mark.parametrize("kind", SLOT_KINDS)
def test_partial_copies_move_only_their_blocks(kind: str) -> None:
    gen = torch.Generator().manual_seed(5)
    layout = Layout((Group("sliding_window", 4, 4, window=4),))
    kv = random_group(2, 0, num_blocks=8, tokens=4, dtype=torch.float32, gen=gen)
    original = snapshot(kv)
    with engine_for(layout, [kv]) as engine:
        slab = make_slots(engine, 2, kind)
        copies = [ChunkCopy(0, slab[0], (6, 7), first_block=2), ChunkCopy(0, slab[1], (1, 2), 2)]
        assert engine.wait(engine.submit_store(copies)).ok
        for slot, copy in zip(slab, copies, strict=True):
            assert torch.equal(slot[: engine.chunk_bytes(0)], expected_slot(kv, 4, copy, FILL))
        back = [ChunkCopy(0, slab[0], (0, 3), first_block=2), ChunkCopy(0, slab[1], (4, 5), 2)]
        assert engine.wait(engine.submit_load(back)).ok
    for now, before in zip(kv.layers, original, strict=True):
        assert blocks_equal(now, before, 0, [0, 3, 4, 5], [6, 7, 1, 2])
        assert blocks_equal(now, before, 0, [1, 2, 6, 7], [1, 2, 6, 7])


@pytest.mark.parametrize("kind", SLOT_KINDS)
def test_state_chunk_holds_one_block_the_state_after_its_last_token(kind: str) -> None:
    """4-token blocks, 2 blocks per chunk: a hit at 16 needs the state in request block 3."""
    gen = torch.Generator().manual_seed(6)
    group = Group("state", 4, 2, bytes_per_state=3 * 40)
    kv = GroupKV(tuple(random_tensor((6, 10, 2), torch.float16, gen) for _ in range(3)))
    original = snapshot(kv)
    table = [5, 4, 3, 2]
    with engine_for(Layout((group,)), [kv]) as engine:
        assert engine.chunk_bytes(0) == 120
        slab = make_slots(engine, 1, kind)
        (run,) = load_set(group, 16)
        copy = engine.copy_for_run(0, slab[0], run, table)
        assert (copy.block_ids, copy.first_block) == ((2,), 0)
        assert engine.wait(engine.submit_store(copy)).ok
        assert torch.equal(slab[0][:120], expected_slot(kv, 1, copy, FILL))
        assert engine.wait(engine.submit_load(ChunkCopy(0, slab[0], (0,)))).ok
    for now, before in zip(kv.layers, original, strict=True):
        assert same_bytes(now[0], before[2])
        assert same_bytes(now[1:], before[1:])


@pytest.mark.parametrize("kind", SLOT_KINDS)
def test_jobs_larger_than_staging_run_in_batches(kind: str) -> None:
    gen = torch.Generator().manual_seed(7)
    layout = Layout((Group("full", 4, 2),))
    kv = random_group(2, 1, num_blocks=64, tokens=4, dtype=torch.bfloat16, gen=gen)
    original = snapshot(kv)
    with engine_for(layout, [kv], staging_bytes=1) as engine:
        slab = make_slots(engine, 32, kind)
        perm = torch.randperm(64, generator=gen).tolist()
        copies = [ChunkCopy(0, slab[i], perm[2 * i : 2 * i + 2]) for i in range(32)]
        assert engine.wait(engine.submit_store(copies)).ok
        for t in kv.layers:
            t.zero_()
        assert engine.wait(engine.submit_load(copies)).ok
    for now, before in zip(kv.layers, original, strict=True):
        assert same_bytes(now, before)


@pytest.mark.parametrize("dim", [8, 6000], ids=["small-blocks", "large-blocks"])
@pytest.mark.parametrize("kind", SLOT_KINDS)
@pytest.mark.parametrize("axis", [0, 1])
def test_runs_of_consecutive_blocks_move_like_scattered_blocks(
    axis: int, kind: str, dim: int
) -> None:
    """Chunks whose blocks are consecutive ids (moved as runs) beside scattered ones and
    partial ones, stored, then loaded into other runs: every slot matches the oracle and
    every block lands where its table says. Large blocks (96,000 bytes) split a run of 3
    or 4 blocks into runs of at most 2."""
    gen = torch.Generator().manual_seed(8)
    layout = Layout((Group("sliding_window", 2, 4, window=8),))
    kv = random_group(3, axis, num_blocks=40, tokens=2, dtype=torch.float16, gen=gen, dim=dim)
    original = snapshot(kv)
    stores = [((4, 5, 6, 7), 0), ((20, 21, 22, 23), 0), ((9, 2, 30, 31), 0), ((12, 13), 2),
              ((36, 37, 38), 1), ((1,), 3)]
    loads = [((24, 25, 26, 27), 0), ((0, 3, 8, 10), 0), ((32, 33, 34, 35), 0), ((14, 15), 2),
             ((16, 17, 18), 1), ((39,), 3)]
    with engine_for(layout, [kv]) as engine:
        slab = make_slots(engine, len(stores), kind)
        copies = [ChunkCopy(0, slab[i], ids, first) for i, (ids, first) in enumerate(stores)]
        assert engine.wait(engine.submit_store(copies)).ok
        for slot, copy in zip(slab, copies, strict=True):
            assert torch.equal(slot[: engine.chunk_bytes(0)], expected_slot(kv, 4, copy, FILL))
        back = [ChunkCopy(0, slab[i], ids, first) for i, (ids, first) in enumerate(loads)]
        assert engine.wait(engine.submit_load(back)).ok
    moved_to = [b for ids, _ in loads for b in ids]
    moved_from = [b for ids, _ in stores for b in ids]
    rest = sorted(set(range(40)) - set(moved_to))
    for now, before in zip(kv.layers, original, strict=True):
        assert blocks_equal(now, before, axis, moved_to, moved_from)
        assert blocks_equal(now, before, axis, rest, rest)


@pytest.mark.parametrize("by_row", [False, True], ids=["slot-tensors", "slab-rows"])
@pytest.mark.parametrize("runs", [False, True], ids=["shuffled", "runs"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(("axis", "first"), [(0, 0), (1, 1)], ids=["axis0-whole", "axis1-partial"])
def test_jobs_split_over_threads_move_exactly_their_blocks(
        axis: int, first: int, threads: int, runs: bool, by_row: bool) -> None:
    """48 copies of 64 KiB chunks (3 MiB) in one slab, over 3 threads (the native copies
    share the ranges out, the torch path splits by slot): every slot holds exactly its
    blocks (oracle), and a load into cleared KV restores every block. ``axis1-partial``: K
    and V pieces, and copies of chunk blocks 1..3 of 4. ``slab-rows``: the slab is
    registered and copies name its rows by index."""
    gen = torch.Generator().manual_seed(9 + axis)
    layout = Layout((Group("full", 16, 4),))
    kv = random_group(2, axis, num_blocks=200, tokens=16, dtype=torch.bfloat16, gen=gen,
                      heads=8, dim=16)
    original = snapshot(kv)
    per = 4 - first  # engine blocks per copy
    if runs:
        starts = (torch.randperm(200 // per, generator=gen)[:48] * per).tolist()
        tables = [[s + k for k in range(per)] for s in starts]
    else:
        tables = torch.randperm(200, generator=gen)[: 48 * per].view(48, per).tolist()
    rows = allocate_slab(48, (64 << 10) + 64, "cpu").fill_(FILL)
    registered = {"slab": rows} if by_row else {}
    with engine_for(layout, [kv], load_threads=threads, **registered) as engine:
        assert engine.chunk_bytes(0) == 64 << 10
        slab = list(rows)
        copies = [ChunkCopy(0, i if by_row else slab[i], ids, first)
                  for i, ids in enumerate(tables)]
        assert engine.wait(engine.submit_store(copies)).ok
        for slot, copy in zip(slab, copies, strict=True):
            assert torch.equal(slot[: engine.chunk_bytes(0)], expected_slot(kv, 4, copy, FILL))
        for t in kv.layers:
            t.zero_()
        assert engine.wait(engine.submit_load(copies)).ok
    moved = [b for ids in tables for b in ids]
    for now, before in zip(kv.layers, original, strict=True):
        assert blocks_equal(now, before, axis, moved, moved)


@pytest.mark.parametrize("slot_order", ["shuffled", "ascending"])
def test_many_small_shuffled_chunks_round_trip_exactly(slot_order: str) -> None:
    """1,500 chunks of 4 one-KiB blocks of 4 layers (the benchmark's 16 KiB row; 24,000
    ranges, several of the native copier's tables of ranges, over 2 threads), block ids
    shuffled, slots named by slab row in shuffled or ascending order (the compiled build
    plans the latter as one batch straight from its C pass): each slot holds exactly its
    copy's blocks, rows outside the job keep their fill, and a load into cleared KV restores
    every moved block and writes no other. Negative control: the same load with the block
    ids of two copies swapped does not restore them (the comparison sees a misplaced
    block)."""
    gen = torch.Generator().manual_seed(28)
    layers, per, chunks, num_blocks = 4, 4, 1500, 7000
    layout = Layout((Group("full", 16, per),))
    kv = random_group(layers, 0, num_blocks=num_blocks, tokens=16, dtype=torch.bfloat16,
                      gen=gen, heads=1, dim=16)
    original = snapshot(kv)
    tables = torch.randperm(num_blocks, generator=gen)[: chunks * per].view(chunks, per)
    slots = torch.randperm(chunks + 10, generator=gen)[:chunks].tolist()
    if slot_order == "ascending":
        slots.sort()
    rows = allocate_slab(chunks + 10, 16 << 10, "cpu").fill_(FILL)
    with engine_for(layout, [kv], load_threads=2, slab=rows) as engine:
        assert engine.chunk_bytes(0) == 16 << 10
        copies = [ChunkCopy(0, s, tuple(ids)) for s, ids in zip(slots, tables.tolist(),
                                                                 strict=True)]
        assert engine.wait(engine.submit_store(copies)).ok
        # slot row r, layer l, position j holds block tables[c, j] of layer l
        want = torch.stack([t.view(num_blocks, -1).view(torch.uint8)[tables]
                            for t in kv.layers], dim=1)  # [chunks, layers, per, 1 KiB]
        assert torch.equal(rows[slots].view(chunks, layers, per, -1), want)
        unused = sorted(set(range(chunks + 10)) - set(slots))
        assert bool((rows[unused] == FILL).all())
        for t in kv.layers:
            t.zero_()
        assert engine.wait(engine.submit_load(copies)).ok
        moved = tables.view(-1)
        for now, before in zip(kv.layers, original, strict=True):
            assert same_bytes(now[moved], before[moved])
            untouched = torch.ones(num_blocks, dtype=torch.bool)
            untouched[moved] = False
            assert not bool(now[untouched].view(torch.uint8).any())
        for t in kv.layers:
            t.zero_()
        swapped = [ChunkCopy(0, s, copies[1 - i].block_ids if i < 2 else c.block_ids)
                   for i, (s, c) in enumerate(zip(slots, copies, strict=True))]
        assert engine.wait(engine.submit_load(swapped)).ok
        first = tables[:2].reshape(-1)
        rest = tables[2:].reshape(-1)
        assert not same_bytes(kv.layers[0][first], original[0][first])
        assert same_bytes(kv.layers[0][rest], original[0][rest])


@pytest.mark.parametrize("with_buffer", [False, True], ids=["rows-only", "with-a-buffer"])
@pytest.mark.parametrize("slab_type", ["torch", "numpy"])
@pytest.mark.parametrize("axis", [0, 1])
def test_slots_named_by_slab_row_round_trip(axis: int, slab_type: str, with_buffer: bool
                                            ) -> None:
    """A registered slab (a tensor, or a numpy array as HostSlab.rows() gives without
    CUDA): copies naming rows by index (plain and numpy ints) and a partial copy, alone
    (the job's addresses computed as arrays) or beside a copy into a separate buffer; each
    slot matches the oracle, rows no copy names stay untouched, and a load into cleared KV
    restores every moved block."""
    gen = torch.Generator().manual_seed(11)
    layout = Layout((Group("full", tokens_per_block=4, blocks_per_chunk=3),))
    kv = random_group(2, axis, num_blocks=24, tokens=4, dtype=torch.bfloat16, gen=gen)
    original = snapshot(kv)
    size = engine_for(layout, [kv]).slot_bytes + 64
    rows = allocate_slab(8, size, "cpu").fill_(FILL)
    registered = rows if slab_type == "torch" else rows.numpy()
    extra = torch.full((size,), FILL, dtype=torch.uint8)
    tables = [([3, 17, 5], 0), ([0, 1, 2], 0), ([19, 8, 11], 0), ([22, 23], 1)]
    refs = [5, np.int64(2), extra if with_buffer else 3, 7]
    slots = [rows[5], rows[2], extra if with_buffer else rows[3], rows[7]]
    untouched = (0, 1, 3, 4, 6) if with_buffer else (0, 1, 4, 6)
    with engine_for(layout, [kv], slab=registered) as engine:
        copies = [ChunkCopy(0, ref, ids, first)
                  for ref, (ids, first) in zip(refs, tables, strict=True)]
        assert engine.wait(engine.submit_store(copies)).ok
        for slot, copy in zip(slots, copies, strict=True):
            assert torch.equal(slot[: engine.chunk_bytes(0)], expected_slot(kv, 3, copy, FILL))
            assert bool((slot[engine.chunk_bytes(0):] == FILL).all())
        for row in untouched:
            assert bool((rows[row] == FILL).all())
        for t in kv.layers:
            t.zero_()
        assert engine.wait(engine.submit_load(copies)).ok
    moved = [b for ids, _ in tables for b in ids]
    for now, before in zip(kv.layers, original, strict=True):
        assert blocks_equal(now, before, axis, moved, moved)


def test_a_state_group_and_an_attention_group_share_slab_rows() -> None:
    """A hybrid layout (full attention + a recurrent state) with its slab registered: one
    job stores a full chunk and the state after it into two rows named by index (the state
    slot holds one block, at slot block 0), and loads both back into other blocks."""
    gen = torch.Generator().manual_seed(13)
    full = Group("full", 4, 2)
    state = Group("state", 4, 2, bytes_per_state=3 * 40)
    kv_full = random_group(2, 1, num_blocks=8, tokens=4, dtype=torch.float16, gen=gen)
    kv_state = GroupKV(tuple(random_tensor((6, 10, 2), torch.float16, gen) for _ in range(3)))
    originals = [snapshot(kv_full), snapshot(kv_state)]
    layout = Layout((full, state))
    size = engine_for(layout, [kv_full, kv_state]).slot_bytes
    rows = allocate_slab(4, size, "cpu").fill_(FILL)
    with engine_for(layout, [kv_full, kv_state], slab=rows) as engine:
        (run,) = load_set(state, 8)
        stores = [ChunkCopy(0, 2, (6, 1)), engine.copy_for_run(1, 0, run, [5, 4])]
        assert stores[1].block_ids == (4,) and stores[1].slot == 0
        assert engine.wait(engine.submit_store(stores)).ok
        want = expected_slot(kv_full, 2, stores[0], FILL)
        assert torch.equal(rows[2][: engine.chunk_bytes(0)], want)
        assert torch.equal(rows[0][:120], expected_slot(kv_state, 1, stores[1], FILL))
        assert bool((rows[1] == FILL).all()) and bool((rows[3] == FILL).all())
        loads = [ChunkCopy(0, 2, (3, 0)), ChunkCopy(1, 0, (1,))]
        assert engine.wait(engine.submit_load(loads)).ok
    assert blocks_equal(kv_full.layers[0], originals[0][0], 1, [3, 0], [6, 1])
    assert blocks_equal(kv_full.layers[1], originals[0][1], 1, [3, 0], [6, 1])
    for now, before in zip(kv_state.layers, originals[1], strict=True):
        assert same_bytes(now[1], before[4])
        assert same_bytes(now[[0, 2, 3, 4, 5]], before[[0, 2, 3, 4, 5]])
