"""``KvtierConnector``: kvtier behind vLLM 0.33's v1 KV-connector interface (with HMA).

This module imports vLLM; ``kvtier.integrations.vllm`` loads it only when vLLM asks for
the connector class. It is a thin shell: the scheduler half is ``ConnectorScheduler``
(``scheduler``), the worker half ``ConnectorWorker`` (``worker``), the layout comes
from ``layout`` and the options from ``config``. Methods here only translate
vLLM's objects into plain data and back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import KVCacheEvent, KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

from kvtier.integrations.vllm.config import connector_setup, sync_loads_apply
from kvtier.integrations.vllm.observe import (
    ConnectorStats,
    KvtierPromMetrics,
    KvtierStats,
    RankTally,
    TierEventLog,
    kv_event,
)
from kvtier.integrations.vllm.scheduled import continuing_horizons, scheduled_steps
from kvtier.integrations.vllm.scheduler import NOTHING, ConnectorScheduler, StepPlan
from kvtier.integrations.vllm.state import layer_tensors
from kvtier.integrations.vllm.tiers import has_lower, scheduler_tiers
from kvtier.integrations.vllm.worker import ConnectorWorker
from kvtier.integrations.vllm.worker_tiers import RankTiers
from kvtier.tiers.records.format import geometry_of

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> workers, once a step: the step's ``StepPlan``."""

    plan: StepPlan


@dataclass
class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """Workers -> scheduler: ``{job_id: (workers that finished it, all succeeded)}``."""

    completed: dict[int, tuple[int, bool]] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, KvtierWorkerMetadata)
        merged = dict(self.completed)
        for job_id, (count, ok) in other.completed.items():
            mine = merged.get(job_id, (0, True))
            merged[job_id] = (mine[0] + count, mine[1] and ok)
        return KvtierWorkerMetadata(merged)


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """kvtier as a vLLM KV connector; configure it with ``kv_connector_extra_config``."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        setup = connector_setup(vllm_config, kv_cache_config)
        self.layout, self.options = setup.layout, setup.options
        self.scheduler: ConnectorScheduler | None = None
        self.worker: ConnectorWorker | None = None
        self._stats: ConnectorStats | None = None
        self._tier_log: TierEventLog | None = None  # worker: its disk tier's events
        self._tally: RankTally | None = None  # scheduler: what every rank's tiers hold
        self._requests: dict[str, Request] = {}
        # the plan before_forward ran for, held (not its id(): a freed plan's id is reused)
        self._prepared: StepPlan | None = None
        self._started: StepPlan | None = None  # the plan whose synchronous loads started
        self._completed: dict[int, tuple[int, bool]] = {}
        self._quiet = KvtierConnectorMetadata(NOTHING)  # a quiet step's (shared: read-only)
        slot_bytes, geometry = setup.slot_bytes, geometry_of(setup.layout)
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler = ConnectorScheduler(
                setup.layout, setup.num_slots, setup.num_workers, policy=setup.options.policy,
                namespace=setup.namespace, store=setup.options.store,
                wait_timeout_s=setup.options.wait_timeout_s,
                boundaries=setup.options.boundaries,
                prune_chunked_local=setup.options.prune_chunked_local,
                admission=setup.tiers.admission(),
                sync_loads=sync_loads_apply(setup.options, setup.layout),
                tiers=scheduler_tiers(setup.tiers, setup.num_workers, slot_bytes, geometry))
            self._stats = ConnectorStats.of_scheduler(self.scheduler)  # from step one on
            self._tally = RankTally(setup.num_workers)
        else:
            rank = int(getattr(vllm_config.parallel_config, "rank", 0) or 0)
            tiers = (RankTiers(setup.tiers, rank, slot_bytes, geometry)
                     if has_lower(setup.tiers) else None)
            self.worker = ConnectorWorker(setup.layout, setup.num_slots, tiers=tiers,
                                          pin_memory=setup.tiers.host.pin_memory)
            self._stats = ConnectorStats.of_worker(tiers)
            self._tier_log = None if tiers is None else TierEventLog(tiers, rank)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a store that does not happen is a later miss

    # ---- scheduler half ----------------------------------------------------------------

    def _sched(self) -> ConnectorScheduler:
        assert self.scheduler is not None, "scheduler-side method called on a worker"
        return self.scheduler

    def on_new_request(self, request: Request) -> None:
        salt = request.cache_salt if self.options.tenant_salt == "cache_salt" else None
        self._sched().add_request(request.request_id, list(request.prompt_token_ids or ()),
                                  salt=salt)
        self._requests[request.request_id] = request

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if request.request_id not in self._requests:
            self.on_new_request(request)
        if request.skip_reading_prefix_cache:
            return 0, False
        return self._sched().lookup(request.request_id, num_computed_tokens,
                                    request.all_token_ids)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        if num_external_tokens:  # otherwise the step's scheduler output has the blocks
            self._sched().after_alloc(request.request_id, blocks.get_block_ids(),
                                      num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        sched = self.scheduler  # (not ``_sched()``: a call less, every step)
        assert sched is not None, "scheduler-side method called on a worker"
        # most decoding steps plan nothing: said without building the step's requests
        horizons = continuing_horizons(scheduler_output)
        if horizons is not None and sched.quiet(horizons) is not None:
            return self._quiet
        for req_id in scheduler_output.preempted_req_ids or ():
            sched.preempt(req_id)
        copies = [c.dst_block_id for c in scheduler_output.kv_cache_block_copies or ()]
        steps = scheduled_steps(scheduler_output, self._requests, self.layout)
        return KvtierConnectorMetadata(sched.step(steps, copies))

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        events = connector_output.kv_cache_events  # None unless a worker has lower tiers
        if events is not None and self._tally is not None:
            self._tally.report(events)
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, KvtierWorkerMetadata) and meta.completed:
            self._sched().on_reports(meta.completed)

    def request_finished(self, request: Request, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request: Request, block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        """Never delays freeing: stores still reading a freed block are fenced instead."""
        self._requests.pop(request.request_id, None)
        self._sched().finish(request.request_id)
        return False, None

    # ---- what the world sees: KV events and metrics (``observe``) ---------------------

    def take_events(self) -> Iterable[KVCacheEvent]:
        """Each chunk stored or dropped, with its tier's medium (``observe.MEDIA``): host
        memory's from the scheduler's store, the lower tiers' once every rank's shard is
        stored (or any rank's is dropped)."""
        sched, tally = self.scheduler, self._tally
        assert sched is not None, "scheduler-side method called on a worker"
        if not sched.events and (tally is None or not tally.pending):
            return ()  # most steps, read without a call (vLLM asks every step)
        host = sched.take_events()
        lower = tally.take() if tally is not None else []
        return [kv_event(event, self.layout.hit_granularity) for event in [*host, *lower]]

    def get_kv_connector_kv_cache_events(self) -> KVConnectorKVEvents | None:
        """Worker: its lower tiers' events since the last step (``observe.RankEvents``)."""
        return None if self._tier_log is None else self._tier_log.take()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """Increments since the last call: the scheduler's (host memory, planner) or a
        worker's (its disk and Redis tiers); vLLM sums them."""
        if self._stats is None:
            return None
        data = self._stats.take()
        return KvtierStats(data=data) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> KVConnectorStats | None:
        return KvtierStats(data=data or {})

    @classmethod
    def build_prom_metrics(
        cls, vllm_config: VllmConfig, metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str], per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        """kvtier's counters and histograms on ``/metrics`` (docs/metrics.md)."""
        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def reset_cache(self) -> bool | None:
        self._sched().clear_cache()
        return True

    # ---- worker half -------------------------------------------------------------------

    def _worker(self) -> ConnectorWorker:
        assert self.worker is not None, "worker-side method called on the scheduler"
        return self.worker

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        groups = self._kv_cache_config.kv_cache_groups
        layers = [[t for name in g.layer_names for t in layer_tensors(kv_caches[name])]
                  for g in groups]
        self._worker().register(layers, self._kv_cache_config.num_blocks)

    # A quiet step's plan (``NOTHING``: most of decoding) asks nothing of the worker; the
    # hooks below only note it, without a call more: they run every step, when the step's
    # forward has pushed the connector's objects out of the CPU's caches, and each function
    # they reach is one more to fetch back (docs/vllm.md, "Where the time goes"). So the
    # bound plan is read where it is needed, from the attribute vLLM's
    # ``bind_connector_metadata`` sets, not through ``_get_connector_metadata``.

    def has_connector_metadata(self) -> bool:
        """False, always: vLLM asks this around every attention layer, to call the layer
        hooks below if it holds, and kvtier has nothing to do per layer (it loads before
        the forward and stores after it). vLLM (0.32, 0.33) asks it nowhere else; the
        step's plan is bound all the same (``start_load_kv`` reads it). Loads layer by
        layer (tried and dropped: docs/vllm.md) would need it True in their steps."""
        return False

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert isinstance(kv_connector_metadata, KvtierConnectorMetadata)
        if kv_connector_metadata.plan is NOTHING:
            self._prepared = NOTHING
        else:
            self._before_forward(kv_connector_metadata.plan)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._connector_metadata
        assert isinstance(meta, KvtierConnectorMetadata), "no kvtier plan bound for this step"
        plan = meta.plan
        if plan is NOTHING:
            self._prepared = NOTHING
        else:
            self._before_forward(plan)
            self._start_sync_loads(plan)

    def _start_sync_loads(self, plan: StepPlan, late: bool = False) -> None:
        if self._started is not plan:  # once a step: vLLM may reach this twice
            self._started = plan
            if plan.sync:
                self._worker().start_sync_loads(plan, late=late)

    def _before_forward(self, plan: StepPlan) -> None:
        if self._prepared is not plan:  # vLLM may call both entry points in one step
            self._prepared = plan
            self._worker().before_forward(plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # a synchronous load is done in start_load_kv, an asynchronous one earlier

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return None  # stores start in wait_for_save, once every layer is written

    def wait_for_save(self) -> None:
        meta = self._connector_metadata
        assert isinstance(meta, KvtierConnectorMetadata), "no kvtier plan bound for this step"
        plan = meta.plan
        if plan is NOTHING:
            self._prepared = NOTHING
            return
        self._before_forward(plan)  # demotions and loads first, if vLLM skipped both hooks
        self._start_sync_loads(plan, late=True)  # (too late to use: reported failed)
        self._worker().after_forward(plan)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        # the step's plan, as before_forward ran it (None only if vLLM skipped every hook)
        idle = self._prepared is not None and self._prepared.idle
        worker = self.worker  # (not ``_worker()``: a function less, every step)
        assert worker is not None, "worker-side method called on the scheduler"
        report = worker.collect(idle=idle)
        for job_id, ok in report.completed.items():
            self._completed[job_id] = (1, ok)
        return KVConnectorTransferResults(finished_recving=set(report.loaded),
                                          failed_recving=set(report.failed_loads))

    def get_block_ids_with_load_errors(self) -> set[int]:
        worker = self.worker
        assert worker is not None, "worker-side method called on the scheduler"
        return worker.take_failed_blocks() if worker.failed_blocks else set()

    def build_connector_worker_meta(self) -> KvtierWorkerMetadata | None:
        if not self._completed:
            return None
        meta, self._completed = KvtierWorkerMetadata(self._completed), {}
        return meta

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.drain()
            self.worker.close()
        if self.scheduler is not None:
            self.scheduler.close()
