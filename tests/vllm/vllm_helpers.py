"""Small helpers over ``VllmSim`` for the connector's scenario tests."""

from __future__ import annotations

from typing import Any

from kvtier import coverage
from kvtier.integrations.vllm.testing import SimGroup, SpecStandIn, VllmSim, native_jobs_done


def make_sim(groups: list[SimGroup], chunk_tokens: int, *, spec: SpecStandIn | None = None,
             lookahead: int = 0, fault: Any = None, host_bytes: int = 1 << 22,
             num_blocks: int = 256, **options: Any) -> VllmSim:
    """kvtier's connector (``options``: more of its ``kv_connector_extra_config``)."""
    extra = {"host_bytes": host_bytes, "chunk_tokens": chunk_tokens, **options}
    return VllmSim(groups, "KvtierConnector", extra, spec=spec, lookahead=lookahead, fault=fault,
                   num_blocks=num_blocks)


def native_sim(groups: list[SimGroup], chunk_tokens: int, num_blocks: int = 256) -> VllmSim:
    """vLLM's native OffloadingConnector, its workers stood in for (every job done in the
    step that issued it): what native offloading hits, for comparison."""
    extra = {"cpu_bytes_to_use": 1 << 26, "block_size": chunk_tokens}
    return VllmSim(groups, "OffloadingConnector", extra, module_path=None, worker=False,
                   report=native_jobs_done, num_blocks=num_blocks)


def chunks(sim: VllmSim, direction: str, request_id: str) -> set[tuple[int, int]]:
    """(group, chunk) of every copy of ``request_id``'s jobs in ``direction``."""
    out = set()
    for meta in sim.plans:
        jobs = meta.plan.loads if direction == "load" else meta.plan.stores
        for job in jobs:
            if job.request_id == request_id:
                out.update((c.group, c.chunk) for c in job.copies)
    return out


def required(sim: VllmSim, boundary: int) -> set[tuple[int, int]]:
    """What ``coverage`` says a hit at ``boundary`` needs, per group."""
    layout = sim.scheduler.connector.layout
    return {(gi, c) for gi, g in enumerate(layout.groups) for c in coverage.required(g, boundary)}


def produce_then_consume(sim: VllmSim, prompt: list[int], consumer_prompt: list[int]) -> Any:
    """Producer runs to completion, vLLM's device cache is reset, then the consumer is
    added and stepped until first scheduled; returns that step's scheduler output."""
    sim.add("producer", prompt, max_tokens=2)
    sim.run()
    sim.reset_device_cache()
    sim.add("consumer", consumer_prompt, max_tokens=2)
    return sim.step_until_scheduled("consumer")


def metrics(sim: VllmSim) -> dict[str, Any]:
    return sim.scheduler.connector.scheduler.planner.metrics.as_dict()


def allocated_below(sim: VllmSim, request_id: str, boundary: int) -> set[tuple[int, int]]:
    """(group, block position) of every real block vLLM's allocator holds below
    ``boundary`` for the request: what vLLM will read as restored KV."""
    table = sim.scheduler.kv_cache_manager.get_block_ids(request_id)
    out = set()
    for gi, g in enumerate(sim.groups):
        top = -(-boundary // g.block_size)
        out.update((gi, i) for i, b in enumerate(table[gi][:top]) if b)
    return out


def retained_blocks(sim: VllmSim, boundary: int) -> set[tuple[int, int]]:
    layout = sim.scheduler.connector.layout
    return {(gi, i) for gi, g in enumerate(layout.groups)
            for i in coverage.retained_blocks(g, boundary)}


def scheduled(out: Any, request_id: str) -> int:
    """Tokens scheduled for the request this step, not counting draft tokens."""
    drafts = len(out.scheduled_spec_decode_tokens.get(request_id, ()))
    return int(out.num_scheduled_tokens[request_id]) - drafts


def restored(sim: VllmSim, prompt: list[int], consumer_prompt: list[int]) -> int:
    """``produce_then_consume``: the consumer's tokens vLLM did not compute (restored)."""
    out = produce_then_consume(sim, prompt, consumer_prompt)
    return len(consumer_prompt) - scheduled(out, "consumer")
