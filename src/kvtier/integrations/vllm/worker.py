"""The worker half of the vLLM connector, in plain data (no vLLM import).

Each vLLM worker holds its own host slab with the same number of slots as the scheduler's
store, and one ``TransferEngine`` over its KV tensors. Per step, in vLLM's order:

1. ``before_forward(plan)`` (vLLM's ``handle_preemptions``, which runs before vLLM zeroes
   or copies any block): write down the chunks the plan demotes (their bytes are copied
   before any job of the plan may overwrite their slots), wait for the earlier store jobs
   in ``plan.flush``, then start this step's asynchronous loads and its promotions;
2. ``start_sync_loads(plan)`` (``start_load_kv``, after vLLM zeroed or copied the step's
   blocks): run the synchronous loads (``plan.sync``), whose requests this step's forward
   computes, and wait for them;
3. ``after_forward(plan)`` (``wait_for_save``): start this step's stores, which read the
   KV the forward just wrote;
4. ``collect()`` (``get_finished``): the jobs finished since the last call, after waiting
   for this step's loads.

vLLM waits for no report of a synchronous load: a failed one is told by its blocks
(``take_failed_blocks``), from which vLLM computes its request again.

Why an asynchronous load is waited for in the step that started it: its request does
nothing until the load is reported, and vLLM reports it only at the end of a step. Left to
finish in the background, a load of tens of megabytes is reported one or more steps late,
and vLLM's loop, stepping without pause meanwhile, holds the GIL that the copying thread
needs between its copies (up to Python's 5 ms switch interval each time): measured on the
CPU engine, a 31 MiB load took 40-70 ms beside the spinning loop and 3968 tokens came warm
in about 3x a resident hit. Waiting lets go of the GIL, and the copy has run beside this
step's forward already. For the same reason, in a step where vLLM scheduled nothing
(``StepPlan.idle``: it steps only because a request waits, e.g. for a promotion)
``collect`` waits up to ``IDLE_WAIT_S`` for a promotion to finish rather than return to a
loop that would spin and hold the GIL the tier thread needs after each read (measured: a
14-chunk promotion from one Redis server took 150-290 ms beside the spinning loop).

With lower tiers (``tiers``, a ``RankTiers``) promotions run on the tier thread, and under
write-through a store job is reported only once its chunks are written to every tier
(``kvtier.integrations.vllm.tiers`` for the whole protocol).

>>> import torch
>>> from kvtier.layout import Group, Layout
>>> layout = Layout((Group("full", 4, 2, bytes_per_token=16),))
>>> worker = ConnectorWorker(layout, num_slots=4)
>>> worker.register([[torch.zeros(8, 2, 4, 1, 2)]], num_blocks=8)
>>> worker.slab.num_slots, worker.slab.slot_bytes
(4, 128)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import torch

from kvtier.integrations.vllm.scheduler import IDLE_WAIT_S, StepPlan
from kvtier.integrations.vllm.worker_tiers import RankTiers
from kvtier.layout import Layout
from kvtier.planner import TransferJob
from kvtier.tiers.host import HostSlab
from kvtier.transfer import ChunkCopy, FaultHook, GroupKV, JobResult, TransferEngine

log = logging.getLogger(__name__)

_FAILED_SYNC_KEPT = 4096
"""Failed synchronous loads remembered, for the stores planned before the scheduler heard
of the failure (``StepPlan.after_sync``: a step or two later at most)."""


@dataclass
class WorkerReport:
    """Jobs this worker finished since the last ``collect``."""

    completed: dict[int, bool] = field(default_factory=dict)
    """kvtier job id -> this worker's copy succeeded."""
    loaded: set[str] = field(default_factory=set)
    """Requests whose load finished (ok or not)."""
    failed_loads: set[str] = field(default_factory=set)
    """Requests whose load failed: vLLM must recompute them."""


class ConnectorWorker:
    """Moves one worker's share of the planned jobs (see the module docstring).

    ``fault`` (tests) is called with each copy before its bytes move; raising fails the job.
    ``tiers``: this rank's tiers below the slab, if any.
    """

    def __init__(self, layout: Layout, num_slots: int, *, fault: FaultHook | None = None,
                 pin_memory: bool | None = None, tiers: RankTiers | None = None) -> None:
        slot_bytes = layout.max_bytes_per_chunk
        if slot_bytes is None:
            raise ValueError("the layout gives no chunk sizes")
        self.layout = layout
        self.slab = HostSlab(num_slots, slot_bytes, pin_memory=pin_memory)
        self.fault = fault
        self.engine: TransferEngine | None = None
        self._running: dict[int, TransferJob] = {}  # engine job id -> kvtier job
        self._loading: list[int] = []  # engine ids of the loads submitted since collect
        self._by_kv_id: dict[int, int] = {}  # kvtier job id -> engine job id
        self._report = WorkerReport()
        self.tiers = tiers
        self._tier_jobs: dict[Future[bool], TransferJob | int] = {}  # -> store job or promotion id
        self._sync: set[int] = set()  # kvtier ids of the synchronous loads in flight
        self.failed_blocks: set[int] = set()  # since take_failed_blocks (read-only)
        self._warned = False
        self._failed_sync: dict[int, None] = {}  # failed synchronous loads, oldest first

    def register(self, layers_by_group: Sequence[Sequence[torch.Tensor]], num_blocks: int) -> None:
        """The KV tensors of every group, in layout order, each with ``num_blocks`` blocks
        on axis 0 (``[num_blocks, 2, ...]``) or 1 (``[2, num_blocks, ...]``)."""
        kv = [GroupKV(tuple(layers), block_axis=_block_axis(layers, num_blocks))
              for layers in layers_by_group]
        # copies name slab rows by index; a slab row too short for a chunk of these tensors
        # (vLLM's page sizes and its tensors disagreeing) is a ValueError here
        self.engine = TransferEngine(self.layout, kv, fault=self.fault, slab=self.slab.rows())

    def before_forward(self, plan: StepPlan) -> None:
        engine = self._engine()
        if self.tiers is not None and plan.demotions:
            self.tiers.demote(self.slab, [(d.key, d.slot, engine.chunk_bytes(d.group))
                                          for d in plan.demotions])
        for job_id in plan.flush:
            engine_id = self._by_kv_id.get(job_id)
            if engine_id is not None and engine_id in self._running:
                self._finish(engine.wait(engine_id))
        for job in plan.loads:
            if job.id not in plan.sync:  # those start after vLLM's zeroing (start_sync_loads)
                self._submit(job)
        for p in plan.promotes:
            self._on_tiers(p.id, partial(self._tiers().promote, self.slab, p.tier, p.keys,
                                         p.slots))

    def start_sync_loads(self, plan: StepPlan, *, late: bool = False) -> None:
        """Run the plan's synchronous loads and wait for them (vLLM's ``start_load_kv``:
        after it zeroed or copied this step's blocks, before its forward). ``late``: the
        forward has run already (vLLM skipped the hook), and may have read their blocks
        before they were written: each counts as failed, and vLLM computes its request
        again."""
        self._sync.update(plan.sync)
        engine = self._engine()
        for job in plan.loads:
            if job.id not in plan.sync:
                continue
            ok = engine.run_load(_copies(job)).ok  # on this thread, which would only wait
            if late and ok:
                if not self._warned:
                    self._warned = True
                    log.warning("kvtier: vLLM started a step's synchronous loads only after "
                                "its forward: their requests are computed again. Set "
                                "sync_loads to false for this engine.")
                ok = False
            self._done(job, ok)

    def after_forward(self, plan: StepPlan) -> None:
        waits = dict(plan.after_sync)
        for job in plan.stores:
            if waits.get(job.id) in self._failed_sync:  # KV computed over a failed load
                self._done(job, False)
            else:
                self._submit(job)

    def collect(self, idle: bool = False) -> WorkerReport:
        """Jobs finished since the last call; the loads submitted since then are waited for
        and, if ``idle`` (a step with nothing scheduled), the first promotion to finish, for
        up to ``IDLE_WAIT_S`` (see the module docstring). The report is the caller's to read,
        not to change (an empty one is handed out again)."""
        if idle:
            promotions = [f for f, job in self._tier_jobs.items() if isinstance(job, int)]
            if promotions:
                wait(promotions, timeout=IDLE_WAIT_S, return_when=FIRST_COMPLETED)
        loading, self._loading = self._loading, []
        if self._running:  # most decoding steps have no job in flight: nothing to ask
            engine = self._engine()
            for engine_id in loading:
                if engine_id in self._running:  # not yet finished by a fence or wait_all
                    self._finish(engine.wait(engine_id))
            for result in engine.poll():
                self._finish(result)
        if self._tier_jobs:
            for future in [f for f in self._tier_jobs if f.done()]:
                self._tier_done(future)
        report = self._report
        if report.completed:  # every load and failure comes with its job: else it is empty
            self._report = WorkerReport()
        return report

    def take_failed_blocks(self) -> set[int]:
        """The blocks of the synchronous loads (``StepPlan.sync``) that failed since the
        last call: vLLM recomputes their requests from the first of them (their requests
        are in no ``WorkerReport``: vLLM waits for no report of a synchronous load)."""
        failed, self.failed_blocks = self.failed_blocks, set()
        return failed

    def wait_all(self) -> None:
        """Wait for every job in flight; the next ``collect`` reports them (tests, shutdown)."""
        engine = self._engine()
        for engine_id in list(self._running):
            self._finish(engine.wait(engine_id))
        for future in list(self._tier_jobs):
            future.exception()
            self._tier_done(future)

    def drain(self) -> WorkerReport:
        """``wait_all``, then ``collect``."""
        self.wait_all()
        return self.collect()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.tiers is not None:
            self.tiers.close()

    # ---- internals ---------------------------------------------------------------------

    def _engine(self) -> TransferEngine:
        if self.engine is None:
            raise RuntimeError("register the KV caches before any transfer")
        return self.engine

    def _submit(self, job: TransferJob) -> int:
        engine = self._engine()
        submit = engine.submit_load if job.direction == "load" else engine.submit_store
        engine_id = submit(_copies(job))
        if job.direction == "load":
            self._loading.append(engine_id)
        self._running[engine_id] = job
        self._by_kv_id[job.id] = engine_id
        return engine_id

    def _finish(self, result: JobResult) -> None:
        job = self._running.pop(result.job_id)
        del self._by_kv_id[job.id]
        if result.ok and job.direction == "store" and self.tiers and self.tiers.write_through:
            engine, slab = self._engine(), self.slab
            copies = [(c.key, c.slot, engine.chunk_bytes(c.group)) for c in job.copies]
            self._on_tiers(job, lambda: self._tiers().write_every_tier(slab, copies))
            return  # reported once written below: the slot is read before it is freed
        self._done(job, result.ok)

    def _tiers(self) -> RankTiers:
        assert self.tiers is not None, "a plan with promotions needs lower tiers"
        return self.tiers

    def _on_tiers(self, job: TransferJob | int, task: Callable[[], bool]) -> None:
        self._tier_jobs[self._tiers().submit(task)] = job

    def _tier_done(self, future: Future[bool]) -> None:
        job = self._tier_jobs.pop(future)
        ok = future.exception() is None and future.result()
        if isinstance(job, int):
            self._report.completed[job] = ok
        else:
            self._done(job, ok)

    def _done(self, job: TransferJob, ok: bool) -> None:
        report = self._report
        report.completed[job.id] = ok
        if job.direction != "load":
            return
        if job.id in self._sync:  # vLLM waits for no report of it, only hears of a failure
            self._sync.discard(job.id)
            if not ok:
                self.failed_blocks.update(b for c in job.copies for b in c.block_ids if b)
                self._failed_sync[job.id] = None
                if len(self._failed_sync) > _FAILED_SYNC_KEPT:
                    del self._failed_sync[next(iter(self._failed_sync))]
            return
        report.loaded.add(job.request_id)
        if not ok:
            report.failed_loads.add(job.request_id)


def _copies(job: TransferJob) -> list[ChunkCopy]:
    return [ChunkCopy(c.group, c.slot, c.block_ids, c.first_block) for c in job.copies]


def _block_axis(layers: Sequence[torch.Tensor], num_blocks: int) -> Literal[0, 1]:
    """0 for ``[num_blocks, ...]`` tensors, 1 for ``[2, num_blocks, ...]``.

    >>> _block_axis([torch.zeros(2, 10, 4)], 10), _block_axis([torch.zeros(10, 2, 4)], 10)
    (1, 0)
    """
    shape = tuple(layers[0].shape)
    if shape[0] == num_blocks:
        return 0
    if len(shape) > 1 and shape[0] == 2 and shape[1] == num_blocks:
        return 1
    raise ValueError(f"cannot find the block axis ({num_blocks} blocks) in KV shape {shape}")
