"""The job protocol: lazy start, per-direction order, failures, poll, wait with a timeout."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
import torch
from transfer_helpers import expected_slot, random_group, same_bytes, snapshot

from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, GroupKV, JobResult, TransferEngine, allocate_slab
from kvtier.transfer.native import Apart

LAYOUT = Layout((Group("full", tokens_per_block=2, blocks_per_chunk=2),))


class Gate:
    """A fault hook that blocks every copy of one slot until the test opens it."""

    def __init__(self, slot: torch.Tensor) -> None:
        self.slot = slot
        self.opened = threading.Event()

    def __call__(self, copy: ChunkCopy) -> None:
        if copy.slot.data_ptr() == self.slot.data_ptr():
            assert self.opened.wait(timeout=30), "test never opened the gate"


class Recorder:
    """A fault hook that records the slot index of each copy, and fails chosen slots."""

    def __init__(self, slab: torch.Tensor, failing: tuple[int, ...] = ()) -> None:
        self._base, self._size = slab.data_ptr(), slab.shape[1]
        self.failing = failing
        self.seen: list[int] = []

    def __call__(self, copy: ChunkCopy) -> None:
        index = (copy.slot.data_ptr() - self._base) // self._size
        self.seen.append(index)
        if index in self.failing:
            raise OSError(f"injected failure on slot {index}")


@pytest.fixture
def kv() -> GroupKV:
    return random_group(2, 0, num_blocks=16, tokens=2, dtype=torch.float16,
                        gen=torch.Generator().manual_seed(11))


@pytest.fixture
def slab() -> torch.Tensor:
    return allocate_slab(8, 1024, "cpu").zero_()


@pytest.fixture
def engine(kv: GroupKV) -> Iterator[TransferEngine]:
    with TransferEngine(LAYOUT, [kv]) as eng:
        yield eng


def worker_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("kvtier-")]


def test_no_thread_before_start_and_start_is_idempotent(kv: GroupKV) -> None:
    before = worker_threads()
    engine = TransferEngine(LAYOUT, [kv])
    assert worker_threads() == before
    engine.start()
    engine.start()
    assert sorted(set(worker_threads()) - set(before)) == ["kvtier-load", "kvtier-store"]
    engine.close()
    assert worker_threads() == before


def test_first_submit_starts_the_workers(kv: GroupKV, slab: torch.Tensor) -> None:
    with TransferEngine(LAYOUT, [kv]) as engine:
        job = engine.submit_store(ChunkCopy(0, slab[0], (1, 2)))
        assert engine.wait(job) == JobResult(job, "store", ok=True)


def test_jobs_of_one_direction_run_in_submission_order(kv: GroupKV, slab: torch.Tensor) -> None:
    recorder = Recorder(slab)
    with TransferEngine(LAYOUT, [kv], fault=recorder) as engine:
        jobs = [engine.submit_store(ChunkCopy(0, slab[i], (2 * i, 2 * i + 1))) for i in range(8)]
        results = [engine.wait(j) for j in jobs]
    assert recorder.seen == list(range(8))
    assert [r.job_id for r in results] == jobs and all(r.ok for r in results)


def test_later_store_into_a_slot_wins(engine: TransferEngine, slab: torch.Tensor) -> None:
    first = engine.submit_store(ChunkCopy(0, slab[0], (1, 2)))
    last = engine.submit_store(ChunkCopy(0, slab[0], (5, 6)))
    reference = engine.submit_store(ChunkCopy(0, slab[1], (5, 6)))
    assert all(engine.wait(j).ok for j in (first, last, reference))
    assert torch.equal(slab[0], slab[1])


def test_later_load_into_a_block_wins(engine: TransferEngine, kv: GroupKV,
                                      slab: torch.Tensor) -> None:
    engine.wait(engine.submit_store([ChunkCopy(0, slab[0], (1, 2)), ChunkCopy(0, slab[1], (3, 4))]))
    original = snapshot(kv)
    engine.submit_load(ChunkCopy(0, slab[0], (9, 10)))
    engine.wait(engine.submit_load(ChunkCopy(0, slab[1], (9, 10))))
    for now, before in zip(kv.layers, original, strict=True):
        assert same_bytes(now[9:11], before[3:5])


def test_injected_failure_fails_only_its_job(kv: GroupKV, slab: torch.Tensor) -> None:
    with TransferEngine(LAYOUT, [kv], fault=Recorder(slab, failing=(1,))) as engine:
        jobs = [engine.submit_store(ChunkCopy(0, slab[i], (i, i + 8))) for i in range(3)]
        failed = engine.submit_load([ChunkCopy(0, slab[0], (3, 4)), ChunkCopy(0, slab[1], (5, 6))])
        loaded = engine.submit_load(ChunkCopy(0, slab[2], (3, 4)))
        results = {j: engine.wait(j) for j in (*jobs, failed, loaded)}
    assert [results[j].ok for j in (*jobs, failed, loaded)] == [True, False, True, False, True]
    assert isinstance(results[jobs[1]].error, OSError)
    assert "slot 1" in str(results[failed].error)


def test_a_blocked_store_does_not_hold_up_loads(kv: GroupKV, slab: torch.Tensor) -> None:
    gate = Gate(slab[7])
    with TransferEngine(LAYOUT, [kv], fault=gate) as engine:
        store = engine.submit_store(ChunkCopy(0, slab[7], (0, 1)))
        load = engine.submit_load(ChunkCopy(0, slab[0], (2, 3)))
        assert engine.wait(load, timeout=30).ok
        gate.opened.set()
        assert engine.wait(store, timeout=30).ok


def test_wait_times_out_on_a_job_that_does_not_finish(kv: GroupKV, slab: torch.Tensor) -> None:
    gate = Gate(slab[0])
    with TransferEngine(LAYOUT, [kv], fault=gate) as engine:
        job = engine.submit_store(ChunkCopy(0, slab[0], (0, 1)))
        later = engine.submit_store(ChunkCopy(0, slab[1], (2, 3)))
        with pytest.raises(TimeoutError, match=f"job {job}"):
            engine.wait(job, timeout=0.01)
        assert engine.poll() == []
        gate.opened.set()
        assert engine.wait(job).ok
        assert engine.wait(later).ok


def test_each_result_is_handed_back_once(engine: TransferEngine, slab: torch.Tensor) -> None:
    job = engine.submit_store(ChunkCopy(0, slab[0], (0, 1)))
    assert engine.wait(job).ok
    with pytest.raises(ValueError, match="already collected"):
        engine.wait(job)
    with pytest.raises(ValueError, match="unknown"):
        engine.wait(12345)
    earlier = engine.submit_store(ChunkCopy(0, slab[1], (0, 1)))
    last = engine.submit_store(ChunkCopy(0, slab[2], (0, 1)))
    assert engine.wait(last).ok  # stores run in order, so `earlier` has finished too
    assert engine.poll() == [JobResult(earlier, "store", ok=True)]
    assert engine.poll() == []


def test_close_runs_queued_jobs_then_refuses_more(kv: GroupKV, slab: torch.Tensor) -> None:
    engine = TransferEngine(LAYOUT, [kv])
    jobs = [engine.submit_store(ChunkCopy(0, slab[i], (i, i + 1))) for i in range(4)]
    engine.close()
    assert [r.job_id for r in engine.poll()] == jobs
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit_load(ChunkCopy(0, slab[0], (0, 1)))
    engine.close()



def test_an_empty_job_is_a_fence_for_its_direction(kv: GroupKV, slab: torch.Tensor) -> None:
    gate = Gate(slab[0])
    with TransferEngine(LAYOUT, [kv], fault=gate) as engine:
        blocked = engine.submit_store(ChunkCopy(0, slab[0], (0, 1)))
        fence = engine.submit_store([])
        with pytest.raises(TimeoutError):
            engine.wait(fence, timeout=0.01)
        gate.opened.set()
        assert engine.wait(fence).ok and engine.wait(blocked).ok


needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs thread affinity (Linux) and two CPUs")


@needs_two_cpus
def test_apart_keeps_enlisted_threads_off_one_cpu_only_while_it_holds() -> None:
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    apart = Apart()
    seen: list[set[int]] = []
    steps = [threading.Event() for _ in range(3)]

    def helper() -> None:
        apart.enlist()
        steps[0].set()
        for step in steps[1:]:  # read its own mask inside the block, then after it
            assert step.wait(timeout=30)
            step.clear()
            seen.append(os.sched_getaffinity(0))
            steps[0].set()

    thread = threading.Thread(target=helper)
    thread.start()
    assert steps[0].wait(timeout=30)
    steps[0].clear()
    with apart(cpu):
        steps[1].set()
        assert steps[0].wait(timeout=30)
        steps[0].clear()
    steps[2].set()
    thread.join(timeout=30)
    assert seen == [allowed - {cpu}, allowed]
    with apart(-1):  # an unknown CPU moves nobody
        assert os.sched_getaffinity(0) == allowed


class AffinityShim:
    """Stands in for ``kvtier._native``: records the CPU each job keeps free (``cpu()``) and
    the mask of every thread when it starts copying, then copies for real."""

    def __init__(self, real: object) -> None:
        self.real = real
        self.free: list[int] = []
        self.masks: list[tuple[str, set[int]]] = []

    def cpu(self) -> int:
        self.free.append(self.real.cpu())  # type: ignore[attr-defined]
        return self.free[-1]

    def copy_lanes(self, *args: object) -> None:
        self.masks.append((threading.current_thread().name, os.sched_getaffinity(0)))
        self.real.copy_lanes(*args)  # type: ignore[attr-defined]

    def sorted_blocks(self, *args: object) -> bytearray:
        return self.real.sorted_blocks(*args)  # type: ignore[attr-defined, no-any-return]


@needs_two_cpus
def test_copy_helpers_run_off_the_copying_cpu_and_anywhere_after(
        copy_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three 3 MiB stores on two threads: in each, the helper copies with the worker's CPU
    taken out of its mask (the first job's helper too, which starts with it), and after
    the jobs every helper may run on every CPU again; the slots hold their blocks."""
    if copy_path != "native":
        pytest.skip("only the native copies use helpers kept apart")
    from kvtier.transfer import native

    shim = AffinityShim(native._native)
    monkeypatch.setattr(native, "_native", shim)
    gen = torch.Generator().manual_seed(12)
    kv = random_group(2, 0, num_blocks=192, tokens=16, dtype=torch.bfloat16, gen=gen,
                      heads=8, dim=16)
    layout = Layout((Group("full", 16, 4),))
    rows = allocate_slab(48, 64 << 10, "cpu")
    allowed = os.sched_getaffinity(0)
    with TransferEngine(layout, [kv], load_threads=2, slab=rows) as engine:
        copies = [ChunkCopy(0, i, (4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3)) for i in range(48)]
        for _ in range(3):
            assert engine.wait(engine.submit_store(copies)).ok
        helpers = [t for t in threading.enumerate() if t.name.startswith("kvtier-copy")]
        assert helpers, "a 3 MiB job on two threads wakes a helper"
        for t in helpers:
            assert t.native_id is not None
            assert os.sched_getaffinity(t.native_id) == allowed
        for i, copy in enumerate(copies):
            assert torch.equal(rows[i], expected_slot(kv, 4, copy, 0))
    assert len(shim.free) == 3 and all(cpu in allowed for cpu in shim.free)
    by_helpers = [mask for name, mask in shim.masks if name.startswith("kvtier-copy")]
    assert len(by_helpers) == 3
    for free, mask in zip(shim.free, by_helpers, strict=True):
        assert mask == allowed - {free}


def test_together_returns_or_raises_only_once_every_helper_is_done() -> None:
    """The calling thread's part fails while a helper still copies: the failure comes out
    only after the helper finished; a helper's failure comes out after the rest ran."""
    from concurrent.futures import ThreadPoolExecutor

    from kvtier.transfer.mover import together

    started, done = threading.Event(), []

    def helper() -> None:
        assert started.wait(timeout=30)
        done.append("helper")

    def own() -> None:
        started.set()
        raise OSError("own part failed")

    with ThreadPoolExecutor(2) as pool:
        with pytest.raises(OSError, match="own part failed"):
            together(pool, [helper], own)
        assert done == ["helper"]

        def failing() -> None:
            raise ValueError("helper failed")

        with pytest.raises(ValueError, match="helper failed"):
            together(pool, [failing], lambda: done.append("own"))
        assert done == ["helper", "own"]
