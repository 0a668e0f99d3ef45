"""``KvtierOffloader``: the reference engine's offloader, on kvtier's real parts.

The reference engine (``kvtier.engine``) calls an ``Offloader`` at fixed points of a
request's life (``kvtier.engine.hooks``). This adapter answers each call with kvtier's
``Planner`` over a ``ChunkStore`` whose slots live in a ``HostSlab``, and moves the bytes
with a ``TransferEngine`` registered on the engine's KV tensors:

=====================  ====================================================================
engine hook            kvtier
=====================  ====================================================================
register_kv_caches     a ``TransferEngine`` over the tensors (a new engine retires the old
                       one: its jobs are finished, its requests forgotten, the store kept)
lookup                 ``planner.add_request`` + ``planner.lookup`` (WAIT: see below)
on_allocated           ``planner.accept_hit`` -> ``submit_load`` (slot n -> ``view(n)``), or
                       ``planner.decline_hit`` for a hit of 0
wait_loaded            wait for the load job -> ``planner.complete_load``; failed -> False
on_computed            ``planner.append_tokens`` + ``planner.on_computed`` -> a store job,
                       batched (below); finished jobs are collected and completed
before_free            ``planner.fence`` -> send those store jobs if batched, wait for them
on_finished            ``planner.finish``
=====================  ====================================================================

A job the data plane fails reaches the planner as ``ok=False``: a failed store frees its
slots (the chunks never become visible), a failed load makes ``wait_loaded`` return False
and the engine recomputes. Both are counted in ``metrics``; ``last_failure`` keeps the
latest failed job's result, error included.

Batching. Store jobs are sent to the data plane in batches, one transfer job per engine
step: a request's store job waits in the batch until ``on_computed`` comes round to a
request that already has one there (the engine began another step), or a fence, lookup,
``drain`` or ``close`` needs it. In a decode step where many requests finish a chunk
together, that is one hand-over to the data plane's thread instead of one per request.
The batch's planner jobs succeed or fail together.

WAIT. The planner answers WAIT when a larger hit needs chunks that are still being written
or loaded. The reference engine has no scheduler that asks again later, so ``lookup``
resolves it at once: it completes every transfer job in flight (all of them are this
offloader's), waits for a ``TieredStore``'s promotions from its lower tiers (disk, Redis)
into host slots, and asks again. A second WAIT can only come from chunks another planner
sharing the store is writing; it is taken as a miss.

Tiers outlive the engine's device cache: after ``engine.reset_device_cache()`` the same
offloader restores from its store, and a fresh ``Engine(config, offloader)`` re-registers
and restores from it too. The store is a host ``ChunkStore``, or a ``TieredStore`` whose
host slab sits above disk and Redis (``TieredStore.from_config``): a new process's store over
the same disk directory restores what the last one wrote. Two offloaders can share one store:
``KvtierOffloader(config.layout(), first.store)``. An offloader serves one engine at a
time: the one that registered last.

Example::

    config = EngineConfig(groups=(GroupSpec("full", tokens_per_block=4, blocks_per_chunk=2),))
    offloader = KvtierOffloader.for_engine(config, host_bytes=16 << 20)
    engine = Engine(config, offloader)
    cold = engine.generate([prompt], max_tokens=4)      # 19 tokens: stores chunks 0 and 1
    engine.reset_device_cache()                          # kvtier's host tier is kept
    warm = engine.generate([prompt], max_tokens=4)
    warm[0].num_restored_tokens                          # 16: the last boundary <= 18
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from types import TracebackType

import torch

from kvtier import coverage
from kvtier.coverage import BlockRun
from kvtier.engine.config import EngineConfig
from kvtier.engine.request import BlockIds, BlockTables, Request
from kvtier.keys import Namespace
from kvtier.layout import Layout
from kvtier.planner import Metrics, Outcome, PlannedCopy, Planner, RequestLimits, TransferJob
from kvtier.store import ChunkStore, ZeroCopyBackend
from kvtier.tiers.host import host_store
from kvtier.tiers.tiered import TieredStore
from kvtier.transfer import (
    DEFAULT_STAGING_BYTES,
    ChunkCopy,
    FaultHook,
    GroupKV,
    JobResult,
    TransferEngine,
)


@dataclass
class _Live:
    """One engine request as the offloader follows it."""

    planner_id: str
    known_tokens: int
    """Tokens handed to the planner so far (the prompt, then generated ones)."""
    num_prompt: int
    load_job: int | None = None
    """Transfer id of the hit's load job, until ``wait_loaded`` collects it."""
    load_ok: bool | None = None
    """How the load ended, once it has (it may be collected before ``wait_loaded``)."""


class KvtierOffloader:
    """The reference engine's ``Offloader`` on a planner, a host store and the data plane.

    ``store`` must be backed by a zero-copy tier (``kvtier.tiers.host.host_store``, or a
    ``TieredStore``, whose host slab is one). ``namespace``
    defaults to the layout's model and KV dtype. ``limits`` apply to every request (by
    default prompts and answers are both stored, for multi-turn chat). ``fault`` is the
    transfer engine's fault hook, for tests.
    """

    def __init__(
        self,
        layout: Layout,
        store: ChunkStore | TieredStore,
        *,
        namespace: Namespace | None = None,
        limits: RequestLimits | None = None,
        fault: FaultHook | None = None,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
    ) -> None:
        if not isinstance(store.backend, ZeroCopyBackend):
            raise ValueError(
                "KvtierOffloader: the store needs a zero-copy tier whose slots the data plane "
                "can address; build it with kvtier.tiers.host.host_store(layout, capacity_bytes)"
            )
        self.layout, self.store, self.limits = layout, store, limits
        self.namespace = namespace or Namespace(layout.model, kv_dtype=layout.kv_dtype)
        self.planner = Planner(layout, store, self.namespace)
        self.last_failure: JobResult | None = None
        self._backend: ZeroCopyBackend = store.backend
        self._fault, self._staging_bytes = fault, staging_bytes
        self._transfer: TransferEngine | None = None
        self._finalizer: weakref.finalize[[], KvtierOffloader] | None = None
        self._session = 0
        self._live: dict[str, _Live] = {}
        self._batch: list[TransferJob] = []  # store jobs not sent to the data plane yet
        self._inflight: dict[int, list[TransferJob]] = {}  # transfer job id -> planner jobs
        self._transfer_id: dict[int, int] = {}  # planner job id -> transfer job id, once sent

    @classmethod
    def for_engine(
        cls, config: EngineConfig, host_bytes: int, *, policy: str = "lru",
        limits: RequestLimits | None = None, fault: FaultHook | None = None,
    ) -> KvtierOffloader:
        """An offloader with a new host store of ``host_bytes`` for engines of ``config``.

        Example: ``Engine(config, KvtierOffloader.for_engine(config, host_bytes=64 << 20))``.
        """
        layout = config.layout()
        store = host_store(layout, host_bytes, policy=policy)
        return cls(layout, store, limits=limits, fault=fault)

    @property
    def metrics(self) -> Metrics:
        """The planner's totals: hits, chunks and bytes loaded and stored, failures."""
        return self.planner.metrics

    # ---- hooks ---------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: list[list[torch.Tensor]]) -> None:
        """Bind a (new) engine's tensors; the previous engine's jobs finish first."""
        self._retire()
        kv = [GroupKV(tuple(layers)) for layers in kv_caches]
        self._transfer = TransferEngine(
            self.layout, kv, fault=self._fault, staging_bytes=self._staging_bytes,
            slab=self._backend.rows(),
        )
        # An offloader dropped without close() must not leave the data plane's threads behind.
        self._finalizer = weakref.finalize(self, self._transfer.close)
        self._session += 1

    def lookup(self, request: Request) -> int:
        """The planner's hit in tokens (0 for a miss); a WAIT is resolved at once."""
        pid = self._planner_id(request)
        if pid not in self._live:
            self.planner.add_request(pid, request.prompt_token_ids, limits=self.limits)
            n = request.num_prompt_tokens
            self._live[pid] = _Live(pid, known_tokens=n, num_prompt=n)
        result = self.planner.lookup(pid)
        if result.outcome is Outcome.WAIT:
            self.drain()
            if isinstance(self.store, TieredStore):
                self.store.flush()  # promotions from a lower tier into host slots
            result = self.planner.lookup(pid)
        return result.hit_tokens if result.outcome is Outcome.HIT else 0

    def on_allocated(self, request: Request, hit_tokens: int, block_tables: BlockTables) -> None:
        """Start the hit's load into the allocated blocks (or release an unused hit)."""
        pid = self._planner_id(request)
        if not hit_tokens:
            self.planner.decline_hit(pid)
            return
        job = self.planner.accept_hit(pid, block_tables)
        self._live[pid].load_job = self._send([job])

    def wait_loaded(self, request: Request) -> bool:
        """Wait for the hit's load; False when it failed (the engine recomputes)."""
        live = self._live[self._planner_id(request)]
        if live.load_ok is None:
            assert live.load_job is not None, "wait_loaded without a hit"
            self._settle(self._engine().wait(live.load_job))
        ok, live.load_ok, live.load_job = bool(live.load_ok), None, None
        return ok

    def on_computed(
        self, request: Request, num_computed_tokens: int, block_tables: BlockTables
    ) -> None:
        """Store the chunks that became storable; collect jobs that finished meanwhile."""
        live = self._live[self._planner_id(request)]
        new = request.output_token_ids[live.known_tokens - live.num_prompt :]
        if new:
            self.planner.append_tokens(live.planner_id, new)
            live.known_tokens += len(new)
        if any(j.request_id == live.planner_id for j in self._batch):
            self._flush()  # the engine came round again: send the last step's stores
        job = self.planner.on_computed(live.planner_id, num_computed_tokens, block_tables)
        if job is not None:
            self._batch.append(job)
        if self._inflight:
            for result in self._engine().poll():
                self._settle(result)

    def before_free(self, request: Request, block_ids: BlockIds) -> None:
        """Return once no store job still reads these blocks."""
        jobs = {j for g, ids in enumerate(block_ids) for j in self.planner.fence(g, ids)}
        if any(j.id in jobs for j in self._batch):
            self._flush()
        for planner_job in sorted(jobs):
            transfer_job = self._transfer_id.get(planner_job)
            if transfer_job is not None:
                self._settle(self._engine().wait(transfer_job))

    def on_finished(self, request: Request) -> None:
        """The request is done: the planner forgets it once its stores complete."""
        pid = self._planner_id(request)
        self.planner.finish(pid)
        del self._live[pid]

    # ---- lifetime ------------------------------------------------------------------------

    def drain(self) -> None:
        """Send batched stores, wait for every transfer job in flight, complete them."""
        self._flush()
        for transfer_job in list(self._inflight):
            if transfer_job in self._inflight:
                self._settle(self._engine().wait(transfer_job))

    def close(self) -> None:
        """Finish every job and stop the data plane's threads; the store is kept."""
        self._retire()

    def __enter__(self) -> KvtierOffloader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---- internals -----------------------------------------------------------------------

    def _planner_id(self, request: Request) -> str:
        """Engine ids repeat across engines (``req-0``); the session keeps them apart."""
        return f"{self._session}/{request.request_id}"

    def _engine(self) -> TransferEngine:
        if self._transfer is None:
            raise RuntimeError("KvtierOffloader: no engine registered its KV caches yet")
        return self._transfer

    def _retire(self) -> None:
        """Finish the current engine's jobs, stop its data plane, forget its requests."""
        if self._transfer is None:
            return
        self.drain()
        if self._finalizer is not None:
            self._finalizer.detach()
        self._transfer.close()
        self._transfer = None
        self.planner.reset()
        self._live.clear()

    def _flush(self) -> None:
        """Send the batched store jobs as one transfer job."""
        if self._batch:
            jobs, self._batch = self._batch, []
            self._send(jobs)

    def _send(self, jobs: list[TransferJob]) -> int:
        """Hand planner jobs of one direction to the data plane as one transfer job; slot
        numbers name rows of the registered slab."""
        copies = [self._copy(c) for job in jobs for c in job.copies]
        engine = self._engine()
        load = jobs[0].direction == "load"
        transfer_job = engine.submit_load(copies) if load else engine.submit_store(copies)
        self._inflight[transfer_job] = jobs
        for job in jobs:
            self._transfer_id[job.id] = transfer_job
        return transfer_job

    def _copy(self, c: PlannedCopy) -> ChunkCopy:
        """The data plane's copy for a planned one: its slot is a row of the registered slab,
        its blocks where ``coverage.slot_block`` puts them."""
        run = BlockRun(c.chunk, c.first_block, len(c.block_ids))
        first = coverage.slot_block(self.layout.groups[c.group], run)
        return ChunkCopy(c.group, c.slot, c.block_ids, first)

    def _settle(self, result: JobResult) -> None:
        """Complete a finished transfer job's planner jobs (failures included)."""
        if not result.ok:
            self.last_failure = result
        for job in self._inflight.pop(result.job_id):
            del self._transfer_id[job.id]
            self._complete(job, result.ok)

    def _complete(self, job: TransferJob, ok: bool) -> None:
        if job.direction == "store":
            self.planner.complete_store(job.id, ok)
            return
        loaded = self.planner.complete_load(job.id, ok)
        live = self._live.get(job.request_id)
        if live is not None:
            live.load_ok = loaded is not None and loaded.ok
