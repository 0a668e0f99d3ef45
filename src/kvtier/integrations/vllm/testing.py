"""Drive vLLM's real ``Scheduler`` with a KV connector and KV tensors in ordinary memory.

For tests and benchmarks on machines without a GPU (vLLM 0.33's scheduler half is pure
Python). A stand-in model runner replaces the GPU worker: each step it hands the
connector's metadata to a worker-role connector, "computes" KV by writing, for every
scheduled position, a value that depends only on the tokens that position's KV depends on
(``kv_value``), samples a fixed token stream, and reports back. Restored KV is therefore
checked against what a cold computation writes (``check_restored``), not against itself.

Needs vLLM; sets ``VLLM_TARGET_DEVICE=cpu``, ``HF_HUB_OFFLINE=1`` (a local ``config.json``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from vllm import SamplingParams

HEADS, HEAD_SIZE = 1, 8
_MOD = (1 << 61) - 1


@dataclass(frozen=True)
class SimGroup:
    """One KV-cache group: ``kind`` is ``full``, ``swa`` or ``chunked``."""

    kind: str = "full"
    block_size: int = 16
    num_layers: int = 1
    window: int = 0
    extra_retained: int = 0
    chunk: int = 0
    eagle: bool = False

    def spec(self) -> Any:
        common = {"block_size": self.block_size, "num_kv_heads": HEADS,
                  "head_size": HEAD_SIZE, "dtype": torch.float16}
        if self.kind == "swa":
            return SlidingWindowSpec(sliding_window=self.window,
                                     extra_retained_tokens=self.extra_retained, **common)
        if self.kind == "chunked":
            return ChunkedLocalAttentionSpec(attention_chunk_size=self.chunk, **common)
        return FullAttentionSpec(**common)


@dataclass
class SpecStandIn:
    """The parts of vLLM's ``SpeculativeConfig`` the scheduler reads (no draft model)."""

    method: str
    num_speculative_tokens: int
    num_modules: int = 1
    disable_eagle_block_drop: bool = False
    disable_lookahead_block_hashes: bool = True
    num_speculative_tokens_per_batch_size: Any = None
    max_num_new_slots_for_drafting: int = 0
    parallel_drafting: bool = False
    draft_model_config: Any = None

    def __post_init__(self) -> None:
        hf = SimpleNamespace(num_nextn_predict_layers=self.num_modules)
        self.draft_model_config = SimpleNamespace(hf_config=hf)

    def use_eagle(self) -> bool:
        return self.method in ("eagle", "eagle3", "mtp")

    def needs_eagle_block_drop(self) -> bool:
        return self.use_eagle()

    def use_eagle_block_drop(self) -> bool:
        return self.use_eagle() and not self.disable_eagle_block_drop

    def use_multi_module_mtp(self) -> bool:
        return self.method == "mtp" and min(self.num_modules, self.num_speculative_tokens) > 1

    def uses_draft_model(self) -> bool:
        return False

    def use_dflash(self) -> bool:
        return False

    def use_dspark(self) -> bool:
        return False

    def uses_dynamic_speculative_decoding(self) -> bool:
        return False

    def compute_hash(self) -> str:
        return f"{self.method}-{self.num_speculative_tokens}"


def make_kv_cache_config(groups: Sequence[SimGroup], num_blocks: int) -> KVCacheConfig:
    specs, tensors = [], []
    for gi, g in enumerate(groups):
        names = [f"g{gi}.l{li}" for li in range(g.num_layers)]
        spec = g.spec()
        page = spec.page_size_bytes
        size = page * num_blocks
        tensors += [KVCacheTensor(size=size, layers=[n], layer_stride=size, block_stride=page)
                    for n in names]
        specs.append(KVCacheGroupSpec(names, spec, is_eagle_group=g.eagle))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=specs)


def make_vllm_config(connector: str, extra: dict[str, Any], *, module_path: str | None,
                     block_size: int, num_blocks: int, max_model_len: int = 2048,
                     spec: SpecStandIn | None = None, failure_policy: str = "recompute",
                     cache: dict[str, Any] | None = None) -> VllmConfig:
    """A ``VllmConfig``: a tiny local Llama, ``connector``, ``cache`` more ``CacheConfig``."""
    from transformers import LlamaConfig

    folder = tempfile.mkdtemp(prefix="kvtier-vllm-")
    LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2,
                num_key_value_heads=1, num_hidden_layers=2, vocab_size=32000,
                max_position_embeddings=max_model_len).save_pretrained(folder)
    model = ModelConfig(model=folder, tokenizer=folder, skip_tokenizer_init=True,
                        max_model_len=max_model_len, dtype="float16", seed=0)
    transfer = KVTransferConfig(kv_connector=connector, kv_connector_module_path=module_path,
                                kv_role="kv_both", kv_connector_extra_config=extra,
                                kv_load_failure_policy=failure_policy)
    config = VllmConfig(
        model_config=model, device_config=DeviceConfig("cpu"), kv_transfer_config=transfer,
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=True,
                                 **(cache or {})),
        scheduler_config=SchedulerConfig(
            max_model_len=max_model_len, is_encoder_decoder=False, max_num_seqs=16,
            max_num_batched_tokens=max_model_len, enable_chunked_prefill=True),
    )
    config.cache_config.num_gpu_blocks = num_blocks
    if spec is not None:
        config.speculative_config = spec
    return config


def kv_value(prefix_hash: int, group: int, layer: int) -> torch.Tensor:
    """The KV a position holds, from the hash of the tokens it depends on."""
    base = (prefix_hash ^ (group * 7919 + layer * 104729)) % 30011
    return (torch.arange(2 * HEADS * HEAD_SIZE, dtype=torch.int32) + base).to(torch.int16)


def native_jobs_done(meta: Any) -> tuple[KVConnectorOutput, int]:
    """Workers' reports for vLLM's native connector when every transfer job it issued this
    step is done, and the blocks its store jobs copy (no bytes move: scheduler half only)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingWorkerMetadata,
    )
    done = {job_id: 1 for job_id in [*meta.load_jobs, *meta.store_jobs]}
    recving = {job.req_id for job in meta.load_jobs.values()}
    stored = [sum(1 for b in job.src_spec.block_ids if b) for job in meta.store_jobs.values()]
    out = KVConnectorOutput(finished_recving=recving,
                            kv_connector_worker_meta=OffloadingWorkerMetadata(done))
    return out, sum(stored)


def kvtier_jobs_done(meta: Any) -> tuple[KVConnectorOutput, int]:
    """``native_jobs_done`` for kvtier's connector."""
    from kvtier.integrations.vllm.connector import KvtierWorkerMetadata

    plan = meta.plan
    done = {job.id: (1, True) for job in [*plan.loads, *plan.stores]}
    recving = {job.request_id for job in plan.loads if job.id not in plan.sync}
    stored = sum(len(c.block_ids) for job in plan.stores for c in job.copies)
    meta = KvtierWorkerMetadata(done)
    return KVConnectorOutput(finished_recving=recving, kv_connector_worker_meta=meta), stored


@dataclass
class SimRequest:
    request: Request
    output: list[int]
    hashes: list[int] = field(default_factory=list)  # hashes[i]: tokens [0, i] hashed
    draft_written: int = -1  # draft groups hold KV for positions below this

    def prefix_hash(self, position: int) -> int:
        tokens = self.request.all_token_ids
        while len(self.hashes) <= position:
            prev = self.hashes[-1] if self.hashes else 17
            self.hashes.append((prev * 1000003 + tokens[len(self.hashes)] + 1) % _MOD)
        return self.hashes[position]


class VllmSim:
    """A real ``Scheduler``, one worker-role connector and per-layer KV tensors; ``config``:
    more ``make_vllm_config`` arguments (``max_model_len``, ``cache``)."""

    def __init__(self, groups: Sequence[SimGroup], connector: str, extra: dict[str, Any], *,
                 module_path: str | None = "kvtier.integrations.vllm", num_blocks: int = 256,
                 spec: SpecStandIn | None = None, worker: bool = True,
                 fault: Callable[[Any], None] | None = None, lookahead: int = 0,
                 sync_transfers: bool = True, config: dict[str, Any] | None = None,
                 report: Callable[[Any], tuple[KVConnectorOutput, int]] | None = None) -> None:
        init_none_hash(sha256)
        self.groups, self.lookahead, self.sync_transfers = list(groups), lookahead, sync_transfers
        self.block_size = max(g.block_size for g in groups)
        self.config = make_vllm_config(connector, extra, module_path=module_path,
                                       block_size=self.block_size, num_blocks=num_blocks,
                                       spec=spec, **(config or {}))
        self.kv_cache_config = make_kv_cache_config(groups, num_blocks)
        self.scheduler = Scheduler(self.config, self.kv_cache_config,
                                   StructuredOutputManager(self.config), self.block_size,
                                   hash_block_size=min(g.block_size for g in groups),
                                   log_stats=True)
        self.hasher = get_request_block_hasher(min(g.block_size for g in groups), sha256)
        self.report = report  # without a worker: its stand-in (native_jobs_done, ...)
        self.plans: list[Any] = []  # every step's connector metadata, for assertions
        self.requests: dict[str, SimRequest] = {}
        self.kv: dict[str, torch.Tensor] = {}
        self.worker: Any = None
        if worker:
            self._make_worker(connector, num_blocks, fault)

    def _make_worker(self, connector: str, num_blocks: int, fault: Any) -> None:
        cls = type(self.scheduler.connector)
        self.worker = cls(self.config, KVConnectorRole.WORKER, self.kv_cache_config)
        if fault is not None:
            self.worker.worker.fault = fault
        for gi, g in enumerate(self.groups):
            for li in range(g.num_layers):
                self.kv[f"g{gi}.l{li}"] = torch.zeros(
                    num_blocks, 2, g.block_size, HEADS, HEAD_SIZE, dtype=torch.int16)
        self.worker.register_kv_caches(self.kv)

    # ---- requests and steps ------------------------------------------------------------

    def add(self, request_id: str, prompt: Sequence[int], max_tokens: int = 2,
            output: Sequence[int] = (), cache_salt: str | None = None) -> Request:
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        request = Request(request_id, list(prompt), params, None, block_hasher=self.hasher,
                          cache_salt=cache_salt)
        self.requests[request_id] = SimRequest(request, list(output) or [5] * max_tokens)
        self.scheduler.add_request(request)
        return request

    def step(self) -> Any:
        out = self.scheduler.schedule()
        connector_output = self._run_worker(out)
        ids = list(out.num_scheduled_tokens)
        sampled = [self._sample(r, out) for r in ids]
        runner = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=sampled, kv_connector_output=connector_output)
        self.scheduler.update_from_output(out, runner)
        return out

    def run(self, max_steps: int = 200) -> int:
        """Step until no request is left; returns the steps taken."""
        for n in range(max_steps):
            if not self.scheduler.has_requests():
                return n
            self.step()
        raise AssertionError(f"requests still running after {max_steps} steps")

    def _run_worker(self, out: Any) -> KVConnectorOutput:
        if self.worker is None:
            return KVConnectorOutput() if self.report is None else self.report(
                out.kv_connector_metadata)[0]
        meta = out.kv_connector_metadata
        self.plans.append(meta)
        self.worker.bind_connector_metadata(meta)
        self.worker.handle_preemptions(meta)
        self.worker.start_load_kv(None)
        for req_id, n in out.num_scheduled_tokens.items():
            self._forward(req_id, n, out)
        self.worker.wait_for_save()
        if self.sync_transfers:  # deterministic tests: every transfer ends within its step
            self.worker.worker.wait_all()
        results = self.worker.get_transfer_results(out.finished_req_ids)
        output = KVConnectorOutput(
            finished_sending=results.finished_sending, finished_recving=results.finished_recving,
            failed_recving=results.failed_recving,
            invalid_block_ids=self.worker.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=self.worker.build_connector_worker_meta())
        self.worker.clear_connector_metadata()
        return output

    def _sample(self, req_id: str, out: Any) -> list[int]:
        sim = self.requests[req_id]
        req = sim.request
        if req.num_computed_tokens < req.num_tokens:  # chunked prefill: nothing sampled yet
            return []
        return [sim.output[len(req.output_token_ids) % len(sim.output)]]

    # ---- the stand-in forward and the checks -------------------------------------------

    def _forward(self, req_id: str, num_scheduled: int, out: Any) -> None:
        sim = self.requests[req_id]
        req = sim.request
        drafts = len(out.scheduled_spec_decode_tokens.get(req_id, ()))
        start = req.num_computed_tokens - num_scheduled  # already advanced by this step
        end = req.num_computed_tokens - drafts  # draft positions: KV that gets rejected
        if sim.draft_written < 0:
            sim.draft_written = start
        table = self.scheduler.kv_cache_manager.get_block_ids(req_id)
        known = len(req.all_token_ids)
        for gi, g in enumerate(self.groups):
            lo, hi = start, end
            if g.eagle:  # a draft position's KV needs the token `lookahead` after it
                lo, hi = sim.draft_written, min(end, known - self.lookahead)
            for p in range(lo, hi):
                self._write(sim, gi, g, table[gi], p)
        for p in range(end, end + drafts):
            self._write_rejected(gi=0, g=self.groups[0], ids=table[0], p=p)
        if any(g.eagle for g in self.groups):
            sim.draft_written = max(sim.draft_written, min(end, known - self.lookahead))

    def _write(self, sim: SimRequest, gi: int, g: SimGroup, ids: list[int], p: int) -> None:
        block = ids[p // g.block_size] if p // g.block_size < len(ids) else 0
        if not block:
            return  # vLLM's null block: out of the window
        depends = self.lookahead if g.eagle else 0
        for li in range(g.num_layers):
            value = kv_value(sim.prefix_hash(p + depends), gi, li)
            self.kv[f"g{gi}.l{li}"][block, :, p % g.block_size] = value.view(2, HEADS, HEAD_SIZE)

    def _write_rejected(self, gi: int, g: SimGroup, ids: list[int], p: int) -> None:
        """KV of a draft token the stand-in rejects: garbage no store may capture."""
        block = ids[p // g.block_size] if p // g.block_size < len(ids) else 0
        if block:
            for li in range(g.num_layers):
                self.kv[f"g{gi}.l{li}"][block, :, p % g.block_size] = -7

    def step_until_scheduled(self, req_id: str, max_steps: int = 50) -> Any:
        """Step until ``req_id`` is scheduled; returns that step's ``SchedulerOutput``."""
        for _ in range(max_steps):
            out = self.step()
            if req_id in out.num_scheduled_tokens:
                return out
        raise AssertionError(f"{req_id} was not scheduled within {max_steps} steps")

    def check_restored(self, req_id: str, boundary: int) -> list[tuple[int, int]]:
        """(group, position) of every retained position below ``boundary`` whose KV is not
        what a cold computation writes; empty when the restore is exact."""
        from kvtier import coverage

        layout = self.scheduler.connector.layout
        sim = self.requests[req_id]
        table = self.scheduler.kv_cache_manager.get_block_ids(req_id)
        bad = []
        for gi, g in enumerate(self.groups):
            span = coverage.retained(layout.groups[gi], boundary)
            for p in range(span.start, span.end):
                if not self._holds(sim, gi, g, table[gi], p):
                    bad.append((gi, p))
        return bad

    def _holds(self, sim: SimRequest, gi: int, g: SimGroup, ids: list[int], p: int) -> bool:
        block = ids[p // g.block_size] if p // g.block_size < len(ids) else 0
        if not block:
            return False
        depends = self.lookahead if g.eagle else 0
        return all(
            torch.equal(self.kv[f"g{gi}.l{li}"][block, :, p % g.block_size].reshape(-1),
                        kv_value(sim.prefix_hash(p + depends), gi, li))
            for li in range(g.num_layers)
        )

    def reset_device_cache(self) -> None:
        """Drop vLLM's own prefix cache (not the connector's) and zero the KV tensors."""
        assert self.scheduler.reset_prefix_cache(reset_connector=False)
        for t in self.kv.values():
            t.zero_()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
