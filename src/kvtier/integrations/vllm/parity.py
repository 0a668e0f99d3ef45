"""kvtier beside vLLM's native offloading, request by request: hits and bytes stored.

The scenarios where native once restored more than kvtier (issue 22), and their
neighbours, each run through vLLM's real ``Scheduler`` once per connector configuration,
with the workers stood in for (every transfer job done in the step that issued it; no bytes
move). Per configuration: the tokens of the measured request vLLM does not compute (its
hit: native reports a repeated prompt's whole length and vLLM computes the last token
again; kvtier restores all but that token) and the bytes the store jobs copy.

Geometry: 16-token blocks, 64-token chunks, one layer per group, 512 bytes per block.
Both connectors store answers too (native ``offload_prompt_only: false``, kvtier
``store: all``), so that a preempted request's generated tokens can be restored.

>>> rows = parity_rows(["repeat 256"])          # doctest: +SKIP
>>> rows[0].hits["native"], rows[0].hits["kvtier"]  # doctest: +SKIP
(255, 255)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kvtier.integrations.vllm.testing import (
    SimGroup,
    VllmSim,
    kvtier_jobs_done,
    native_jobs_done,
)

CHUNK = 64
BLOCK_BYTES = 2 * 16 * 1 * 8 * 2  # K and V, 16 tokens, 1 head of 8, fp16
GEOMETRIES: dict[str, list[SimGroup]] = {
    "full": [SimGroup("full", 16)],
    "full+swa128": [SimGroup("full", 16), SimGroup("swa", 16, window=128)],
    "full+local256": [SimGroup("full", 16), SimGroup("chunked", 16, chunk=256)],
}
#: configuration -> (connector, its kv_connector_extra_config)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "native": ("OffloadingConnector", {"cpu_bytes_to_use": 1 << 26, "block_size": CHUNK,
                                       "offload_prompt_only": False}),
    "kvtier": ("KvtierConnector", {"host_bytes": 1 << 24, "chunk_tokens": CHUNK}),
    "kvtier-shared": ("KvtierConnector", {"host_bytes": 1 << 24, "chunk_tokens": CHUNK,
                                          "boundaries": "shared"}),
    "kvtier-end": ("KvtierConnector", {"host_bytes": 1 << 24, "chunk_tokens": CHUNK,
                                       "boundaries": "end"}),
}
_rng = random.Random(22)
TOKENS = [_rng.randrange(1, 30000) for _ in range(600)]


@dataclass(frozen=True)
class Row:
    """One scenario on one geometry: hit tokens and bytes stored per configuration."""

    scenario: str
    geometry: str
    hits: dict[str, int]
    stored_bytes: dict[str, int]


def _sim(config: str, groups: list[SimGroup], num_blocks: int, stored: list[int]) -> VllmSim:
    connector, extra = CONFIGS[config]
    done = native_jobs_done if connector == "OffloadingConnector" else kvtier_jobs_done

    def report(meta: Any) -> Any:
        out, blocks = done(meta)
        stored[0] += blocks
        return out, blocks

    module = None if connector == "OffloadingConnector" else "kvtier.integrations.vllm"
    return VllmSim(groups, connector, extra, module_path=module, worker=False,
                   report=report, num_blocks=num_blocks)


def consumer_hit(sim: VllmSim, producer: list[int], consumer: list[int]) -> int:
    """Producer to completion, device cache reset, then the consumer: the tokens vLLM did
    not compute when it first computed for the consumer."""
    sim.add("producer", producer, max_tokens=2)
    sim.run()
    sim.reset_device_cache()
    sim.add("consumer", consumer, max_tokens=2)
    out = sim.step_until_scheduled("consumer")
    hit = len(consumer) - int(out.num_scheduled_tokens["consumer"])
    sim.run()
    return hit


def resumed_hit(sim: VllmSim) -> int:
    """``big`` (400 tokens) then ``consumer`` (300) decode until blocks run out (54 blocks)
    and vLLM preempts ``consumer`` with 369 tokens known: where its compute resumes."""
    sim.add("big", TOKENS[:400], max_tokens=200, output=list(range(100, 300)))
    sim.add("consumer", TOKENS[400:] + TOKENS[:100], max_tokens=120,
            output=list(range(500, 620)))
    request = sim.requests["consumer"].request
    preempted = False
    for _ in range(600):
        out = sim.step()
        preempted = preempted or "consumer" in out.preempted_req_ids
        if preempted and "consumer" in out.num_scheduled_tokens:
            hit = request.num_computed_tokens - int(out.num_scheduled_tokens["consumer"])
            sim.run()
            return hit
    raise AssertionError("consumer was never preempted and resumed")


#: scenario -> (geometries, blocks, run)
SCENARIOS: dict[str, tuple[tuple[str, ...], int, Callable[[VllmSim], int]]] = {
    "extends a 100-token prompt": (("full", "full+swa128", "full+local256"), 256,
                                   lambda sim: consumer_hit(sim, TOKENS[:100],
                                                            TOKENS[:100] + TOKENS[500:510])),
    "repeat 256": (("full", "full+swa128", "full+local256"), 256,
                   lambda sim: consumer_hit(sim, TOKENS[:256], TOKENS[:256])),
    "repeat 257": (("full", "full+swa128", "full+local256"), 256,
                   lambda sim: consumer_hit(sim, TOKENS[:257], TOKENS[:257])),
    "first 478 of 547": (("full", "full+swa128", "full+local256"), 256,
                         lambda sim: consumer_hit(sim, TOKENS[:547], TOKENS[:478])),
    "first 250 of 547": (("full+local256",), 256,
                         lambda sim: consumer_hit(sim, TOKENS[:547], TOKENS[:250])),
    "resumed (369 known)": (("full",), 54, resumed_hit),
}


def parity_rows(scenarios: Iterable[str] = SCENARIOS) -> list[Row]:
    """Every scenario on each of its geometries, through every configuration."""
    rows = []
    for name in scenarios:
        geometries, num_blocks, run = SCENARIOS[name]
        for geometry in geometries:
            hits, stored_bytes = {}, {}
            for config in CONFIGS:
                stored = [0]
                sim = _sim(config, GEOMETRIES[geometry], num_blocks, stored)
                hits[config] = run(sim)
                stored_bytes[config] = stored[0] * BLOCK_BYTES
            rows.append(Row(name, geometry, hits, stored_bytes))
    return rows


def shortfalls(rows: Iterable[Row], config: str) -> list[Row]:
    """The rows where ``config`` restores fewer tokens than native."""
    return [r for r in rows if r.hits[config] < r.hits["native"]]


def render(rows: Iterable[Row]) -> str:
    """A markdown table: hit tokens per configuration, then bytes stored."""
    configs = list(CONFIGS)
    head = ["scenario", "geometry", *configs, *(f"{c} bytes" for c in configs)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * 2 + " ---: |" * 2 * len(configs)]
    for r in rows:
        cells = [r.scenario, r.geometry, *(str(r.hits[c]) for c in configs),
                 *(f"{r.stored_bytes[c]:,}" for c in configs)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
