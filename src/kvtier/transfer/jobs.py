"""The transfer engine: asynchronous, ordered store and load jobs over registered KV tensors.

Protocol::

    slab = allocate_slab(1024, layout.max_bytes_per_chunk, "cuda")  # page-locked slots
    engine = TransferEngine(layout, [GroupKV(full_layers), GroupKV(swa_layers)], slab=slab)
    engine.start()                          # optional: the first submit starts it too
    job = engine.submit_store([ChunkCopy(0, 5, block_ids=(7, 8, 9, 10))])  # into slab[5]
    result = engine.wait(job)               # or engine.poll() for every finished job
    result = engine.run_load([ChunkCopy(0, 5, block_ids=(7, 8, 9, 10))])  # a load waited for
    assert result.ok
    engine.close()                          # drains queued jobs, stops the workers

Why the steps are separate: ``submit_*`` checks the copies and returns at once (on CUDA,
after recording an event on the caller's current stream, which the job waits for before it
touches any byte); the bytes move on one worker thread per direction, so stores never
queue behind loads and each direction runs its jobs in submission order; ``poll`` and
``wait`` hand back each job's :class:`JobResult` exactly once. No thread starts in the
constructor: ``start`` (or the first submit) starts both workers.

Until a job's result is handed back, the caller must neither reuse its slots nor let the
engine overwrite or free its blocks (the planner's fences). An empty job is allowed and
finishes after every job queued before it in its direction.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import numpy as np
import torch

from kvtier import coverage
from kvtier.coverage import BlockRun
from kvtier.layout import Layout
from kvtier.transfer import native
from kvtier.transfer.copies import ChunkCopy, Direction, GroupKV, JobResult, SlotRef
from kvtier.transfer.mover import Copier, FaultHook, Mover
from kvtier.transfer.plan import Batch, plan_job
from kvtier.transfer.slots import register_slab
from kvtier.transfer.torch_copier import TorchCopier
from kvtier.transfer.views import build_views

DEFAULT_STAGING_BYTES = 64 << 20
"""Staging per direction on the KV device (grown to the largest part a job needs); a job
larger than this runs in several parts. On CUDA each part scatters by a few kernels per
block position and layer, so small parts pay their launches on few bytes: with 4 MiB parts
the CUDA path moved 2 MiB chunks at an eighth of a plain copy's speed (H200, 2026-12-04)."""


def copier_maker(device: torch.device, fault: FaultHook | None,
                 staging_bytes: int) -> Callable[[int], Copier]:
    """Builds, given its thread count, the copier each direction's mover runs: the native
    one on the CPU of a compiled build (:func:`kvtier.transfer.native.available`), else the
    torch one. The engine asks once, when it is built."""
    if device.type == "cpu" and native.available():
        return lambda threads: native.NativeCopier(fault, threads)
    return lambda threads: TorchCopier(device, fault, staging_bytes, threads)


@dataclass(frozen=True)
class _Job:
    job_id: int
    batches: list[Batch]
    ready: object | None


class _Worker:
    """One direction: a FIFO queue and the thread that drains it."""

    def __init__(
        self, direction: Direction, mover: Mover, report: Callable[[JobResult], None]
    ) -> None:
        self.direction = direction
        self._mover = mover
        self._report = report
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._moving = threading.Lock()  # held while a job's bytes move
        self._thread = threading.Thread(target=self._loop, name=f"kvtier-{direction}", daemon=True)
        self._thread.start()

    def put(self, job: _Job) -> None:
        self._queue.put(job)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()
        with self._moving:  # a job moving on a caller's thread (run_here) finishes first
            self._mover.close()

    def run_here(self, job: _Job) -> JobResult | None:
        """Run ``job`` on the calling thread if no job put here is unfinished (else None,
        and nothing ran): a job put meanwhile waits for it, so the order holds."""
        with self._moving:
            if self._queue.unfinished_tasks:
                return None
            return self._run(job)

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            with self._moving:
                result = self._run(job)
            self._report(result)
            self._queue.task_done()

    def _run(self, job: _Job) -> JobResult:
        run = self._mover.store if self.direction == "store" else self._mover.load
        try:
            run(job.batches, job.ready)
            return JobResult(job.job_id, self.direction, ok=True)
        except Exception as exc:  # reported to the caller, never swallowed
            return JobResult(job.job_id, self.direction, ok=False, error=exc)


class TransferEngine:
    """Moves chunks between registered engine KV tensors and host slots.

    ``kv`` holds one :class:`GroupKV` per layout group, in layout order; registration is
    checked here (``ValueError`` says what to fix). ``fault``, for tests, is called with
    each copy just before its slot bytes move; if it raises, that job fails and later jobs
    run normally. ``staging_bytes`` bounds the staging buffer of each direction.
    ``load_threads`` (CPU only): threads one job's copies spread over (in the pure build,
    a store spreads over torch's intra-op threads inside ``index_select`` instead); ``None``,
    the default, takes torch's intra-op thread count. ``slab``: a ``[num_slots, row_bytes]``
    uint8 host array (``allocate_slab``) whose rows copies may then name by index,
    ``ChunkCopy(group, slot=7, ...)``: the cheaper way to name a slot, checked in a few
    array operations per job rather than per copy. The bytes move by the copier
    :func:`copier_maker` picks here, once: the native one on the CPU of a compiled build.
    """

    def __init__(
        self, layout: Layout, kv: Sequence[GroupKV], *, fault: FaultHook | None = None,
        staging_bytes: int = DEFAULT_STAGING_BYTES, load_threads: int | None = None,
        slab: torch.Tensor | np.ndarray | None = None,
    ) -> None:
        if load_threads is not None and load_threads < 1:
            raise ValueError(f"load_threads must be at least 1, got {load_threads}")
        self._views, self.device = build_views(layout, kv)
        self._slab = None if slab is None else register_slab(slab, self.slot_bytes)
        self._layout = layout
        self._new_copier = copier_maker(self.device, fault, staging_bytes)
        self._load_threads = load_threads
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._pending: set[int] = set()
        self._done: dict[int, JobResult] = {}
        self._claimed: set[int] = set()  # run_load's queued jobs: neither polled nor waited
        self._workers: dict[str, _Worker] = {}
        self._closed = False

    # -- sizes -------------------------------------------------------------------------

    def chunk_bytes(self, group: int) -> int:
        """Bytes of one chunk of ``group`` in a slot (the slot prefix it uses)."""
        return self._views[group].chunk_bytes

    @property
    def slot_bytes(self) -> int:
        """The smallest slot that holds a chunk of every group: the largest chunk."""
        return max(v.chunk_bytes for v in self._views)

    def copy_for_run(
        self, group: int, slot: SlotRef, run: BlockRun, block_table: Sequence[int]
    ) -> ChunkCopy:
        """The copy for a :class:`BlockRun` (from ``load_set``), given the group's block table.

        ``block_table[i]`` is the engine block holding the request's block ``i``. Example:
        4 blocks per chunk, ``BlockRun(chunk=1, first_block=3, num_blocks=1)`` and
        ``block_table[7] == 42`` give ``ChunkCopy(group, slot, (42,), first_block=3)``. For
        a state group the run must be the chunk's last block, and maps to slot block 0.
        """
        bpc = self._layout.groups[group].blocks_per_chunk
        start = run.chunk * bpc + run.first_block
        ids = tuple(block_table[start : start + run.num_blocks])
        if len(ids) != run.num_blocks:
            raise ValueError(f"block_table has {len(block_table)} entries; {run} needs "
                             f"{start + run.num_blocks}")
        first = coverage.slot_block(self._layout.groups[group], run)
        return ChunkCopy(group, slot, ids, first_block=first)

    # -- jobs --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the two worker threads (idempotent; ``submit_*`` calls it lazily)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("TransferEngine is closed")
            if self._workers:
                return
            for direction in ("store", "load"):
                threads = self._load_threads or torch.get_num_threads()
                mover = Mover(self.device, self._new_copier(threads))
                self._workers[direction] = _Worker(direction, mover, self._report)

    def submit_store(self, copies: Sequence[ChunkCopy] | ChunkCopy) -> int:
        """Queue engine blocks -> slots; returns the job id. Bad copies raise ValueError."""
        return self._submit("store", copies)

    def submit_load(self, copies: Sequence[ChunkCopy] | ChunkCopy) -> int:
        """Queue slots -> engine blocks; returns the job id. Bad copies raise ValueError."""
        return self._submit("load", copies)

    def run_load(self, copies: Sequence[ChunkCopy] | ChunkCopy) -> JobResult:
        """Slots -> engine blocks now, after every load submitted before it; the result
        comes back here, never from ``poll`` or ``wait``. Bad copies raise ValueError.

        For a caller that would only wait for the load: on the CPU, with no load queued,
        the bytes move on the calling thread (no hand-over to the load thread and back);
        otherwise, and on CUDA (whose copies run on the load stream), the job is queued on
        the load thread and waited for."""
        batches = plan_job(self._views, "load", copies, self._slab)  # checks the copies
        self.start()
        ready = self._record_ready()
        with self._cond:
            if self._closed:
                raise RuntimeError("TransferEngine is closed")
            job = _Job(next(self._ids), batches, ready)
            worker = self._workers["load"]
        if self.device.type == "cpu":
            result = worker.run_here(job)
            if result is not None:
                return result
        with self._cond:  # behind the queued loads, on the load thread
            if self._closed:
                raise RuntimeError("TransferEngine is closed")
            self._pending.add(job.job_id)
            self._claimed.add(job.job_id)
            worker.put(job)
        result = self._take(job.job_id, None)
        with self._cond:  # (a wait cut short leaves it claimed: no one else collects it)
            self._claimed.discard(job.job_id)
        return result

    def poll(self) -> list[JobResult]:
        """Every job finished since the last poll or wait, by job id; each reported once."""
        with self._cond:
            out = [self._done.pop(j) for j in sorted(self._done) if j not in self._claimed]
        return out

    def wait(self, job_id: int, timeout: float | None = None) -> JobResult:
        """Block until ``job_id`` finishes; ``TimeoutError`` if it has not after ``timeout`` s."""
        return self._take(job_id, timeout, claimed=False)

    def _take(self, job_id: int, timeout: float | None, claimed: bool = True) -> JobResult:
        """``wait``'s, and run_load's for its own job (``claimed``)."""
        with self._cond:
            known = job_id in self._pending or job_id in self._done
            if not known or (not claimed and job_id in self._claimed):
                raise ValueError(f"job {job_id} is unknown or its result was already collected")
            if not self._cond.wait_for(lambda: job_id in self._done, timeout):
                raise TimeoutError(f"job {job_id} did not finish within {timeout} s")
            return self._done.pop(job_id)

    def close(self) -> None:
        """Run every queued job, then stop the workers. Later submits raise RuntimeError."""
        with self._cond:
            self._closed = True
            workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.stop()

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _submit(self, direction: Direction, copies: Sequence[ChunkCopy] | ChunkCopy) -> int:
        batches = plan_job(self._views, direction, copies, self._slab)  # checks the copies
        self.start()
        ready = self._record_ready()
        with self._cond:  # ids and queue order agree, even with concurrent submitters
            if self._closed:
                raise RuntimeError("TransferEngine is closed")
            job_id = next(self._ids)
            self._pending.add(job_id)
            self._workers[direction].put(_Job(job_id, batches, ready))
        return job_id

    def _record_ready(self) -> object | None:
        """On CUDA, an event on the caller's current stream: the job starts after it."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _report(self, result: JobResult) -> None:
        with self._cond:
            self._pending.discard(result.job_id)
            self._done[result.job_id] = result
            self._cond.notify_all()
