"""``vllm_engine.py``'s first token under load: a warm start while other requests decode.

A quiet warm start (``ttft_turn``) has the engine to itself, so vLLM's steps cost little
and how kvtier loads (in a step of its own, or in the step that computes the request:
``sync_loads``) barely shows. In a serving engine other requests are decoding: every step
is a batch's forward, and a load in a step of its own delays the first token by one. Each
turn here starts ``batch`` requests decoding, then adds the prompt warm from kvtier (vLLM's
own cache reset), then the same prompt again as a vLLM prefix-cache hit, each timed from
its arrival to its first token while the batch decodes. (Always in that order: vLLM's cache
cannot be reset under running requests. In quiet turns the warm run after a cold one is
the slower, so the order leans against kvtier.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from vllm import LLM, SamplingParams

BACKGROUND_TOKENS = 48
"""Tokens each background request generates: enough steps for both timed requests."""


def busy_turn(llm: LLM, p: Any, seed: int, batch: int, prompt: Callable[[int, int], Any]
              ) -> dict[str, float]:
    """Prompt ``p``, already stored by kvtier: its first token warm from kvtier and as a
    vLLM hit, in seconds, with ``batch`` requests (``prompt(seed + i, 64)``) decoding."""
    engine = llm.llm_engine
    llm.reset_prefix_cache()  # vLLM's own cache only: kvtier's store is kept
    background = SamplingParams(temperature=0.0, max_tokens=BACKGROUND_TOKENS, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"busy-{seed}-{i}", prompt(seed + i, 64), background)
    for _ in range(4):  # the batch's prefill, then decoding
        engine.step()
    times = {}
    for run in ("kvtier", "vllm-hit"):
        request_id = f"busy-{seed}-{run}"
        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        start = time.perf_counter()
        engine.add_request(request_id, p, one)
        while not any(o.request_id == request_id and o.finished for o in engine.step()):
            pass
        times[run] = time.perf_counter() - start
    while engine.has_unfinished_requests():
        engine.step()
    return times


def busy_figures(turns: list[dict[str, float]]) -> dict[str, Any]:
    """Medians of the busy turns (no target: issue 28's is for the quiet warm start)."""
    if not turns:
        return {}
    ratios = [t["kvtier"] / t["vllm-hit"] for t in turns]
    return {"ttft_busy_kvtier_s": statistics.median(t["kvtier"] for t in turns),
            "ttft_busy_vllm_hit_s": statistics.median(t["vllm-hit"] for t in turns),
            "ttft_busy_kvtier_over_vllm_hit": statistics.median(ratios),
            "ttft_busy_ratios": [round(r, 3) for r in ratios]}


def busy_line(figures: dict[str, Any], batch: int) -> str:
    """The table's line for the busy turns ('' without them)."""
    if "ttft_busy_ratios" not in figures:
        return ""
    return (f"first token while {batch} requests decode (no target): warm from kvtier "
            f"{figures['ttft_busy_kvtier_s']:.3f} s, vLLM hit "
            f"{figures['ttft_busy_vllm_hit_s']:.3f} s, ratio "
            f"{figures['ttft_busy_kvtier_over_vllm_hit']:.3f} (turns "
            f"{figures['ttft_busy_ratios']})")
