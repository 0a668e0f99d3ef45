"""kvtier beside vLLM's native offloading on Mamba1 and Mamba2 models, on vLLM's real
``Scheduler`` (vLLM 0.33, scheduler half; the workers stood in for).

vLLM's CPU build cannot run Mamba2 forwards with prefix caching, so these models are checked
at the scheduler: the same requests through native ``OffloadingConnector`` (its default:
one GPU block per offloaded chunk) and through kvtier, with vLLM's Mamba groups in
``mamba_cache_mode="align"`` and the block size vLLM picks for each model (``block_size``).
Per request: the tokens of the measured request vLLM does not compute (its hit).

Block size. A hybrid's attention block grows until one attention page holds a layer's
recurrent state (vLLM's ``Platform._align_hybrid_block_size``): ``B = a * ceil(S / (a *
P))``, with ``S`` one layer's state bytes (conv plus SSM state), ``P`` one layer's
attention bytes per token and ``a`` the attention backend's kernel block alignment (16 for
FlashAttention); the Mamba group takes the same ``B`` in align mode. A Mamba-only model has
no attention page to match and keeps the default 16. ``B`` depends on the model only, not
on the request: e.g. Jamba (Mamba1) 80, Nemotron-H-8B (Mamba2, fp32 SSM state) 1040.

Which state vLLM hands over. In align mode vLLM cuts each prefill at the last block
boundary before the prompt's last token and keeps (and offers a connector, in
``boundary_state_offloads``) the state there only: a hit lands on that boundary, a multiple
of ``B`` that need not be a multiple of a larger chunk. kvtier's default chunk with a state
group is therefore one block (``layout.default_chunk_tokens``); the issue's first rule, the
smallest multiple of ``B`` of at least 256 tokens, is the ``kvtier>=256`` column.

>>> MODELS["jamba"].block_size(), MODELS["nemotron-h-8b"].block_size()
(80, 1040)
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_interface import MambaSpec

from kvtier.integrations.vllm.scheduled import offloads_of
from kvtier.integrations.vllm.testing import (
    HEAD_SIZE,
    HEADS,
    SimGroup,
    SimRequest,
    VllmSim,
    kvtier_jobs_done,
    native_jobs_done,
)
from kvtier.presets import mamba2_state_bytes

CONV_SHAPE, SSM_SHAPE = (3, 8), (4, 8)
"""The stand-in runner's state tensors per block (the hit does not depend on their size)."""


@dataclass(frozen=True)
class MambaModel:
    """One published model's recurrent and attention geometry, per layer, TP 1."""

    family: str  # "mamba1" or "mamba2"
    intermediate: int  # d_inner: expand * hidden (Mamba1), heads * head_dim (Mamba2)
    state_size: int  # d_state
    conv_kernel: int = 4
    n_groups: int = 0  # Mamba2 B/C groups
    ssm_heads: int = 0  # Mamba2
    ssm_head_dim: int = 0  # Mamba2
    ssm_dtype_bytes: int = 2  # vLLM's mamba_ssm_cache_dtype: auto (the model's bf16), fp32
    kv_heads: int = 0  # 0: a Mamba-only model
    head_dim: int = 128

    def state_bytes(self) -> int:
        """``S``: conv state (bf16) plus SSM state, as vLLM's ``MambaStateShapeCalculator``
        (Mamba1: conv over ``d_inner`` channels, SSM state ``d_inner x d_state``)."""
        if self.family == "mamba2":
            return mamba2_state_bytes(self.ssm_heads, self.ssm_head_dim, self.state_size,
                                      self.n_groups, self.conv_kernel,
                                      ssm_bytes=self.ssm_dtype_bytes)
        ssm = self.intermediate * self.state_size * self.ssm_dtype_bytes
        return (self.conv_kernel - 1) * self.intermediate * 2 + ssm

    def block_size(self, alignment: int = 16) -> int:
        """``B``, as vLLM's hybrid allocator picks it (module docstring)."""
        if not self.kv_heads:
            return 16
        per_token = 2 * self.kv_heads * self.head_dim * 2  # K and V, bf16
        return alignment * math.ceil(self.state_bytes() / (alignment * per_token))


MODELS: dict[str, MambaModel] = {
    # ai21labs/Jamba-v0.1 (Jamba 1.5 Mini alike): Mamba1 + attention, SSM state in bf16
    "jamba": MambaModel("mamba1", 8192, 16, kv_heads=8),
    # the same with --mamba-ssm-cache-dtype float32 (what vLLM's CPU platform forces)
    "jamba-ssm-fp32": MambaModel("mamba1", 8192, 16, ssm_dtype_bytes=4, kv_heads=8),
    # nvidia/Nemotron-H-8B: Mamba2 + attention, vLLM keeps its SSM state in fp32
    "nemotron-h-8b": MambaModel("mamba2", 8192, 128, n_groups=8, ssm_heads=128,
                                ssm_head_dim=64, ssm_dtype_bytes=4, kv_heads=8),
    # tiiuae/falcon-mamba-7b: Mamba1 only
    "falcon-mamba-7b": MambaModel("mamba1", 8192, 16),
}


@dataclass(frozen=True)
class MambaGroup:
    """A Mamba group in align mode for ``VllmSim`` (``SimGroup``'s fields, duck-typed)."""

    block_size: int
    kind: str = "mamba"
    num_layers: int = 1
    eagle: bool = False

    def spec(self) -> Any:
        page = self.block_size * 2 * HEADS * HEAD_SIZE * 2  # padded to the attention page
        return MambaSpec(block_size=self.block_size, shapes=(CONV_SHAPE, SSM_SHAPE),
                         dtypes=(torch.float16, torch.float32), page_size_padded=page,
                         mamba_cache_mode="align")


def groups_of(model: str) -> list[Any]:
    """A model's KV-cache groups: its Mamba group, then full attention if it has any."""
    geometry = MODELS[model]
    block = geometry.block_size()
    attention = [SimGroup("full", block)] if geometry.kv_heads else []
    return [MambaGroup(block), *attention]


def state_value(prefix_hash: int, layer: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """The state after a prefix, from its hash (values exact in fp16)."""
    base = (prefix_hash ^ (layer * 104729)) % 1000
    return (torch.arange(math.prod(shape)) + base).to(dtype).view(shape)


class HybridSim(VllmSim):
    """``VllmSim`` with Mamba groups in align mode: the stand-in forward writes, per step,
    the state after its last token into the block vLLM's table holds for that token (as
    vLLM's runner does: one state per step, not one per block the step crosses)."""

    def __init__(self, groups: list[Any], connector: str, extra: dict[str, Any], *,
                 max_model_len: int = 8192, **kwargs: Any) -> None:
        self.states: dict[str, list[torch.Tensor]] = {}
        self.offloads: dict[str, list[tuple[int, int, int]]] = {}
        """Per request, every ``(group, block_id, boundary)`` vLLM handed over."""
        cache = {"mamba_cache_mode": "align", "mamba_block_size": groups[0].block_size}
        super().__init__(groups, connector, extra,
                         config={"max_model_len": max_model_len, "cache": cache}, **kwargs)
        connector_half = self.scheduler.connector
        build = connector_half.build_connector_meta

        def recording(out: Any) -> Any:  # vLLM clears the hand-offs once this returned
            for req_id, entries in offloads_of(out).items():
                self.offloads.setdefault(req_id, []).extend(entries)
            return build(out)

        connector_half.build_connector_meta = recording

    def _make_worker(self, connector: str, num_blocks: int, fault: Any) -> None:
        cls = type(self.scheduler.connector)
        self.worker = cls(self.config, KVConnectorRole.WORKER, self.kv_cache_config)
        if fault is not None:
            self.worker.worker.fault = fault
        caches: dict[str, Any] = {}
        for gi, g in enumerate(self.groups):
            for li in range(g.num_layers):
                name = f"g{gi}.l{li}"
                if g.kind == "mamba":
                    caches[name] = self.states[name] = [
                        torch.zeros(num_blocks, *CONV_SHAPE, dtype=torch.float16),
                        torch.zeros(num_blocks, *SSM_SHAPE, dtype=torch.float32)]
                else:
                    caches[name] = self.kv[name] = torch.zeros(
                        num_blocks, 2, g.block_size, HEADS, HEAD_SIZE, dtype=torch.int16)
        self.worker.register_kv_caches(caches)

    def _forward(self, req_id: str, num_scheduled: int, out: Any) -> None:
        super()._forward(req_id, num_scheduled, out)
        sim = self.requests[req_id]
        last = sim.request.num_computed_tokens - 1  # the step's last token
        table = self.scheduler.kv_cache_manager.get_block_ids(req_id)
        for gi, g in enumerate(self.groups):
            ids = table[gi]
            block = ids[last // g.block_size] if g.kind == "mamba" and last >= 0 else 0
            if last // g.block_size < len(ids) and block:
                for li in range(g.num_layers):
                    for t in self.states[f"g{gi}.l{li}"]:
                        t[block] = state_value(sim.prefix_hash(last), li, t.shape[1:], t.dtype)

    def _write(self, sim: SimRequest, gi: int, g: Any, ids: list[int], p: int) -> None:
        if g.kind != "mamba":  # a state is written once per step (``_forward``)
            super()._write(sim, gi, g, ids, p)

    def _holds(self, sim: SimRequest, gi: int, g: Any, ids: list[int], p: int) -> bool:
        """A state group retains ``[b - 1, b)``: the block vLLM reads holds the state
        after token ``p = b - 1``."""
        if g.kind != "mamba":
            return super()._holds(sim, gi, g, ids, p)
        block = ids[p // g.block_size] if p // g.block_size < len(ids) else 0
        return bool(block) and all(
            torch.equal(t[block], state_value(sim.prefix_hash(p), li, t.shape[1:], t.dtype))
            for li in range(g.num_layers) for t in self.states[f"g{gi}.l{li}"])

    def reset_device_cache(self) -> None:
        super().reset_device_cache()
        for tensors in self.states.values():
            for t in tensors:
                t.zero_()


_rng = random.Random(27)
TOKENS = [_rng.randrange(1, 30000) for _ in range(6000)]
ANSWER = 8
"""Tokens a chat turn's answer has."""


def first_hit(sim: VllmSim, request_id: str, prompt: list[int], finish: bool = True) -> int:
    """Add the request and step until vLLM first computes for it: the tokens it did not
    compute then (vLLM may cut that step short at a block boundary, so not ``len(prompt)``
    minus the step's tokens). Then every request runs to completion, if ``finish``."""
    sim.add(request_id, prompt, max_tokens=ANSWER, output=list(range(100, 100 + ANSWER)))
    out = sim.step_until_scheduled(request_id)
    hit = sim.requests[request_id].request.num_computed_tokens
    hit -= int(out.num_scheduled_tokens[request_id])
    if finish:
        sim.run()
    return hit


def consumer_hit(sim: VllmSim, producer: list[int], consumer: list[int]) -> int:
    """Producer to completion, vLLM's device cache reset, then the consumer's hit."""
    first_hit(sim, "producer", producer)
    sim.reset_device_cache()
    return first_hit(sim, "consumer", consumer)


def chat_prompts(block: int, turns: int) -> list[list[int]]:
    """A chat's prompts: turn 1 is one and a half blocks; each later turn's prompt is the
    previous prompt, its answer and half a block and three tokens more."""
    prompts = [TOKENS[: block + block // 2]]
    user = 3000
    for _ in range(turns - 1):
        more = TOKENS[user : user + block // 2 + 3]
        prompts.append(prompts[-1] + list(range(100, 100 + ANSWER)) + more)
        user += len(more)
    return prompts


def chat_hit(sim: VllmSim, block: int, turns: int) -> int:
    """Each turn runs to completion and vLLM's device cache is reset before the next: the
    last turn's hit (what it restores of the earlier turns)."""
    hit = 0
    for i, prompt in enumerate(chat_prompts(block, turns)):
        hit = first_hit(sim, f"turn{i + 1}", prompt)
        sim.reset_device_cache()
    return hit


def _repeat(n: Callable[[int], int]) -> Callable[[VllmSim, int], int]:
    return lambda sim, b: consumer_hit(sim, TOKENS[: n(b)], TOKENS[: n(b)])


#: request -> run(sim, block size): the measured request's hit
SCENARIOS: dict[str, Callable[[VllmSim, int], int]] = {
    "repeat B-1": _repeat(lambda b: b - 1),
    "repeat B": _repeat(lambda b: b),
    "repeat B+1": _repeat(lambda b: b + 1),
    "repeat 2B": _repeat(lambda b: 2 * b),
    "repeat 2B+1": _repeat(lambda b: 2 * b + 1),
    "repeat 3.5B": _repeat(lambda b: 3 * b + b // 2),
    "extends 2B+5 by 10": lambda sim, b: consumer_hit(sim, TOKENS[: 2 * b + 5],
                                                      TOKENS[: 2 * b + 15]),
    "first 2B+3 of 3B+7": lambda sim, b: consumer_hit(sim, TOKENS[: 3 * b + 7],
                                                      TOKENS[: 2 * b + 3]),
    "chat turn 2": lambda sim, b: chat_hit(sim, b, 2),
    "chat turn 3": lambda sim, b: chat_hit(sim, b, 3),
}


def old_default(block: int) -> int:
    """The issue's first default: the smallest multiple of ``block`` of at least 256."""
    return -(-256 // block) * block


def configs(block: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """configuration -> (connector, its ``kv_connector_extra_config``), on defaults."""
    return {"native": ("OffloadingConnector", {"cpu_bytes_to_use": 1 << 27}),
            "kvtier": ("KvtierConnector", {"host_bytes": 1 << 27}),
            "kvtier>=256": ("KvtierConnector", {"host_bytes": 1 << 27,
                                                "chunk_tokens": old_default(block)})}


def make_sim(model: str, config: str, *, worker: bool = False) -> HybridSim:
    """A model's groups under one configuration; the workers stood in for unless
    ``worker`` (kvtier only: its worker copies the stand-in's KV and states)."""
    groups = groups_of(model)
    connector, extra = configs(groups[0].block_size)[config]
    native = connector == "OffloadingConnector"
    return HybridSim(groups, connector, extra, module_path=None if native else
                     "kvtier.integrations.vllm", worker=worker and not native,
                     report=native_jobs_done if native else kvtier_jobs_done)


@dataclass(frozen=True)
class Row:
    model: str
    block: int
    request: str
    hits: dict[str, int]


def hybrid_rows(models: list[str] | None = None, requests: list[str] | None = None
                ) -> list[Row]:
    """Every request on every model, through every configuration."""
    rows = []
    for model in models or list(MODELS):
        block = MODELS[model].block_size()
        for request in requests or list(SCENARIOS):
            hits = {}
            for config in configs(block):
                sim = make_sim(model, config)
                hits[config] = SCENARIOS[request](sim, block)
                sim.close()
            rows.append(Row(model, block, request, hits))
    return rows


def render(rows: list[Row]) -> str:
    """A markdown table: hit tokens per configuration."""
    lines = ["| model | B | request | native | kvtier | kvtier, chunk >= 256 |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        h = r.hits
        lines.append(f"| {r.model} | {r.block} | {r.request} | {h['native']:,} | "
                     f"{h['kvtier']:,} | {h['kvtier>=256']:,} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(hybrid_rows()))
