"""The time-to-first-token figures of ``vllm_engine.py`` and ``vllm_hybrid.py``, from their
turns (a helper, not a benchmark): each turn is ``vllm_engine.ttft_turn``'s cold run, warm
run from kvtier and hit in vLLM's own prefix cache.

A turn's two warm runs take turns at going first, and the first after the cold run comes
out slower whichever it is (on this project's CPU engine about 15% in 2026-12's runs). The
median of every turn's ratio then leans to whichever order has more turns (with the default
7 turns, kvtier's run first in 4): the warm ratio is instead the geometric mean of each
order's median ratio, which cancels an order effect, and each order's median is reported.
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def ttft_figures(turns: list[dict[str, float]]) -> dict[str, Any]:
    """Medians over the turns: the three times to first token and the hits; kvtier's warm
    run over cold per turn; kvtier's warm run over vLLM's hit, counterbalanced (module
    docstring); and that ratio's median for each order (None for an order with no turn)."""
    med = statistics.median
    by_order: dict[bool, list[float]] = {True: [], False: []}
    for t in turns:
        by_order[bool(t["kvtier_first"])].append(t["kvtier"] / t["vllm-hit"])
    medians = [med(ratios) for ratios in by_order.values() if ratios]
    return {
        "ttft_cold_s": med(t["cold"] for t in turns),
        "ttft_kvtier_s": med(t["kvtier"] for t in turns),
        "ttft_vllm_hit_s": med(t["vllm-hit"] for t in turns),
        "kvtier_hit_tokens": med(t["kvtier_hit"] for t in turns),
        "vllm_hit_tokens": med(t["vllm_hit"] for t in turns),
        "ttft_kvtier_over_cold": med(t["kvtier"] / t["cold"] for t in turns),
        "ttft_kvtier_over_vllm_hit": math.exp(statistics.fmean(map(math.log, medians))),
        "ttft_kvtier_first_over_vllm_hit": med(by_order[True]) if by_order[True] else None,
        "ttft_vllm_first_kvtier_over_vllm_hit": (med(by_order[False]) if by_order[False]
                                                 else None),
    }
