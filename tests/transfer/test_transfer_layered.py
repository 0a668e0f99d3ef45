"""Layered loads: ``submit_load(..., layered=True)`` moves a job layer by layer, and
``wait_layers`` returns once the layers asked for are in place (vLLM's attention waits so
for its layer's part of a synchronous load)."""

from __future__ import annotations

import threading

import pytest
import torch
from transfer_helpers import blocks_equal, random_group, snapshot

from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, GroupKV, TransferEngine, allocate_slab
from kvtier.transfer.mover import Mover
from kvtier.transfer.plan import Batch, plan_job
from kvtier.transfer.views import build_views

LAYOUT = Layout((Group("full", tokens_per_block=2, blocks_per_chunk=2),
                 Group("sliding_window", tokens_per_block=4, blocks_per_chunk=1, window=4)))
TABLES = [(0, (3, 9)), (0, (4, 5)), (1, (7,)), (0, (12, 1))]  # (group, block ids)


def groups(seed: int) -> list[GroupKV]:
    """Three layers in group 0 and two in group 1: a job's groups end at different layers."""
    gen = torch.Generator().manual_seed(seed)
    return [random_group(3, 0, num_blocks=16, tokens=2, dtype=torch.bfloat16, gen=gen),
            random_group(2, 1, num_blocks=16, tokens=4, dtype=torch.bfloat16, gen=gen)]


def stored(engine: TransferEngine, slab: torch.Tensor) -> list[ChunkCopy]:
    copies = [ChunkCopy(g, row, ids) for row, (g, ids) in enumerate(TABLES)]
    assert engine.wait(engine.submit_store(copies)).ok
    return copies


@pytest.mark.parametrize("axis_seed", [1, 2, 3])
def test_a_layered_load_restores_what_a_whole_load_does(axis_seed: int) -> None:
    kv = groups(axis_seed)
    original = [snapshot(g) for g in kv]
    slab = allocate_slab(len(TABLES), 4096, "cpu")
    with TransferEngine(LAYOUT, kv, slab=slab) as engine:
        copies = stored(engine, slab)
        for g in kv:
            for t in g.layers:
                t.zero_()
        job = engine.submit_load(copies, layered=True)
        engine.wait_layers(job, 3)
        assert engine.wait(job).ok
    for g, (group, before) in enumerate(zip(kv, original, strict=True)):
        ids = [b for gi, table in TABLES if gi == g for b in table]
        for now, then in zip(group.layers, before, strict=True):
            assert blocks_equal(now, then, group.block_axis, ids, ids)
    # negative control: a block no copy names stayed zero, so the check can fail
    assert not blocks_equal(kv[0].layers[0], original[0][0], 0, [2], [2])


def test_wait_layers_waits_until_the_job_moves() -> None:
    opened = threading.Event()
    calls: list[ChunkCopy] = []

    def gate(copy: ChunkCopy) -> None:
        calls.append(copy)
        assert opened.wait(timeout=30), "the test never opened the gate"

    kv = groups(5)
    slab = allocate_slab(len(TABLES), 4096, "cpu")
    with TransferEngine(LAYOUT, kv, slab=slab, fault=gate) as engine:
        opened.set()
        copies = stored(engine, slab)
        calls.clear()
        opened.clear()
        layered = engine.submit_load(copies, layered=True)
        with pytest.raises(TimeoutError, match="first 1 layers"):
            engine.wait_layers(layered, 1, timeout=0)
        opened.set()
        engine.wait_layers(layered, 2)
        assert engine.wait(layered).ok
        # the fault hook saw each copy once, not once per layer
        assert sorted(c.slot for c in calls) == [0, 1, 2, 3]
        engine.wait_layers(layered, 3)  # collected: it has ended, nothing to wait for
        # a job not moved layer by layer is waited for whole
        opened.clear()
        whole = engine.submit_load(copies)
        with pytest.raises(TimeoutError):
            engine.wait_layers(whole, 1, timeout=0)
        opened.set()
        engine.wait_layers(whole, 1)
        assert engine.wait(whole, timeout=0).ok


def test_a_layered_load_that_fails_ends_every_wait() -> None:
    def fault(copy: ChunkCopy) -> None:
        if copy.slot == 2:
            raise OSError("injected failure")

    kv = groups(6)
    slab = allocate_slab(len(TABLES), 4096, "cpu")
    with TransferEngine(LAYOUT, kv, slab=slab) as engine:
        copies = stored(engine, slab)
    with TransferEngine(LAYOUT, kv, slab=slab, fault=fault) as engine:
        job = engine.submit_load(copies, layered=True)
        engine.wait_layers(job, 3)  # returns: the job ended
        result = engine.wait(job)
        assert not result.ok and isinstance(result.error, OSError)


class _Recording:
    """A copier that records which layers of which batch it moved, in order."""

    def __init__(self, log: list[object]) -> None:
        self.log = log

    def load(self, batch: Batch) -> None:
        self.log.append((batch.view.index, [li for li, _ in batch.layer_items()]))

    def store(self, batch: Batch) -> None:
        raise AssertionError("no store here")

    def close(self) -> None:
        pass


def test_each_layer_of_every_batch_moves_before_its_progress_is_told() -> None:
    views, _ = build_views(LAYOUT, groups(7))
    slots = allocate_slab(len(TABLES), 4096, "cpu")
    copies = [ChunkCopy(g, slots[row], ids) for row, (g, ids) in enumerate(TABLES)]
    batches = plan_job(views, "load", copies)
    log: list[object] = []
    Mover(torch.device("cpu"), _Recording(log)).load(batches, None, log.append)
    told = [i for i, entry in enumerate(log) if isinstance(entry, int)]
    assert [log[i] for i in told] == [1, 2, 3]  # group 0's three layers; group 1 has two
    moves = [entry for entry in log if isinstance(entry, tuple)]
    assert len(moves) == sum(len(b.view.layers) for b in batches)  # each layer once
    assert all(len(layers) == 1 for _, layers in moves)
    for i in told:  # every batch's layers below n moved before n was told, none above
        moved = {(entry[0], li) for entry in log[:i] if isinstance(entry, tuple)
                 for li in entry[1]}
        n = log[i]
        assert moved == {(b.view.index, li) for b in batches
                         for li in range(min(n, len(b.view.layers)))}
