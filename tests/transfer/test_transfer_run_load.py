"""``TransferEngine.run_load``: a load whose caller only waits for it moves on the calling
thread when no load is queued, after every load submitted before it otherwise; its result
comes back from the call alone."""

from __future__ import annotations

import threading

import pytest
import torch
from transfer_helpers import random_group, same_bytes, snapshot

from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, GroupKV, TransferEngine, allocate_slab

LAYOUT = Layout((Group("full", tokens_per_block=2, blocks_per_chunk=2),))


class Threads:
    """A fault hook recording the thread each copy runs on; it blocks the copies of
    ``gate_slot`` until ``opened`` and fails those of ``fail_slot``."""

    def __init__(self, slab: torch.Tensor, gate_slot: int = -1, fail_slot: int = -1) -> None:
        self._base, self._size = slab.data_ptr(), slab.shape[1]
        self.gate_slot, self.fail_slot = gate_slot, fail_slot
        self.opened = threading.Event()
        self.seen: list[tuple[int, str]] = []

    def __call__(self, copy: ChunkCopy) -> None:
        index = (copy.slot.data_ptr() - self._base) // self._size
        self.seen.append((index, threading.current_thread().name))
        if index == self.gate_slot:
            assert self.opened.wait(timeout=30), "the test never opened the gate"
        if index == self.fail_slot:
            raise OSError(f"injected failure on slot {index}")


@pytest.fixture
def kv() -> GroupKV:
    return random_group(2, 0, num_blocks=16, tokens=2, dtype=torch.bfloat16,
                        gen=torch.Generator().manual_seed(5))


@pytest.fixture
def slab() -> torch.Tensor:
    return allocate_slab(8, 1024, "cpu").zero_()


def test_a_load_with_none_queued_moves_on_the_calling_thread(kv: GroupKV,
                                                            slab: torch.Tensor) -> None:
    hook = Threads(slab)
    with TransferEngine(LAYOUT, [kv], fault=hook) as engine:
        assert engine.wait(engine.submit_store(ChunkCopy(0, slab[3], (4, 5)))).ok
        original = snapshot(kv)
        for t in kv.layers:
            t[4:6].zero_()
        assert not same_bytes(kv.layers[0][4:6], original[0][4:6])  # the check can fail
        result = engine.run_load(ChunkCopy(0, slab[3], (4, 5)))
        assert result.ok and result.direction == "load" and result.error is None
        assert engine.poll() == []  # its result was the call's
        with pytest.raises(ValueError, match="unknown"):
            engine.wait(result.job_id)
    assert hook.seen[-1] == (3, threading.current_thread().name)
    for now, before in zip(kv.layers, original, strict=True):
        assert same_bytes(now, before)


def test_a_load_submitted_before_it_runs_first(kv: GroupKV, slab: torch.Tensor) -> None:
    """Three loads into blocks 9-10: a gated one, one queued behind it, then ``run_load``;
    the last one's bytes must win, whichever thread moves them."""
    hook = Threads(slab)
    with TransferEngine(LAYOUT, [kv], fault=hook) as engine:
        stores = [ChunkCopy(0, slab[i], (2 * i, 2 * i + 1)) for i in range(3)]
        assert engine.wait(engine.submit_store(stores)).ok
        original = snapshot(kv)
        hook.gate_slot = 0
        gated = engine.submit_load(ChunkCopy(0, slab[0], (9, 10)))
        queued = engine.submit_load(ChunkCopy(0, slab[1], (9, 10)))
        opener = threading.Thread(target=hook.opened.set)
        opener.start()  # the gate opens while (or before) run_load waits behind both
        result = engine.run_load(ChunkCopy(0, slab[2], (9, 10)))
        opener.join()
        assert result.ok and engine.wait(gated).ok and engine.wait(queued).ok
    assert [i for i, _ in hook.seen[-3:]] == [0, 1, 2]
    for now, before in zip(kv.layers, original, strict=True):
        assert same_bytes(now[9:11], before[4:6])


def test_a_failed_copy_is_its_result_and_the_engine_goes_on(kv: GroupKV,
                                                           slab: torch.Tensor) -> None:
    with TransferEngine(LAYOUT, [kv], fault=Threads(slab, fail_slot=1)) as engine:
        result = engine.run_load(ChunkCopy(0, slab[1], (2, 3)))
        assert not result.ok and isinstance(result.error, OSError)
        assert "slot 1" in str(result.error)
        assert engine.run_load(ChunkCopy(0, slab[2], (2, 3))).ok
        assert engine.wait(engine.submit_load(ChunkCopy(0, slab[2], (4, 5)))).ok


def test_bad_copies_and_a_closed_engine_are_refused(kv: GroupKV, slab: torch.Tensor) -> None:
    engine = TransferEngine(LAYOUT, [kv])
    with pytest.raises(ValueError, match="block"):
        engine.run_load(ChunkCopy(0, slab[0], (99, 100)))
    assert engine.run_load(ChunkCopy(0, slab[0], (0, 1))).ok
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.run_load(ChunkCopy(0, slab[0], (0, 1)))
