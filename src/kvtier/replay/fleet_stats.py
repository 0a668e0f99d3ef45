"""What a fleet replay reports: fleet and per-engine hit rates, loads by tier, imbalance,
and percentiles of the modelled time to first token (docs/replay.md).

* hit rates: the engines' counts summed (``ReplayStats``), so a fleet of one reports
  exactly its engine's;
* hits by tier: chunks and bytes the hits loaded from each engine's own host memory, its
  own disk, and the shared tier;
* imbalance: the most requests (and prefill tokens: prompt less hit) any engine served,
  over the mean per engine; 1.0 is a perfect balance;
* TTFT: the 50th, 90th and 99th percentiles of every request's modelled time to first
  token, with the cache and without (``ReplayStats.ttft_samples``; linear interpolation).

>>> percentiles([1.0, 2.0, 3.0, 4.0, 5.0])
{'p50': 3.0, 'p90': 4.6, 'p99': 4.96}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtier.replay.stats import ReplayStats

PERCENTILES = (50, 90, 99)
_SUMMED = ("requests", "block_refs", "block_hits", "prompt_tokens", "hit_tokens",
           "hit_requests", "store_refusals")


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """``p50``, ``p90``, ``p99`` of ``values`` (all 0.0 when there are none)."""
    if not values:
        return {f"p{p}": 0.0 for p in PERCENTILES}
    got = np.percentile(np.asarray(values, dtype=np.float64), PERCENTILES)
    return {f"p{p}": round(float(v), 12) for p, v in zip(PERCENTILES, got, strict=True)}


def ttft_percentiles(samples: Sequence[tuple[float, float]]) -> dict[str, dict[str, float]]:
    """Percentiles of the modelled TTFT with the cache (``ttft_s``) and without it."""
    return {"ttft_s": percentiles([w for _, w in samples]),
            "ttft_cold_s": percentiles([c for c, _ in samples])}


def _imbalance(values: Sequence[int]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean else 1.0


@dataclass
class FleetStats:
    """Totals of one fleet replay: one ``ReplayStats`` per engine, and which served what."""

    router: str
    engines: list[ReplayStats]
    assignment: list[int]
    """The engine of each request, in trace order."""
    shared_slots: int
    wall_s: float

    def total(self, name: str) -> int:
        """A count summed over engines (``ReplayStats``' field ``name``)."""
        return sum(getattr(s, name) for s in self.engines)

    @property
    def block_hit_rate(self) -> float:
        refs = self.total("block_refs")
        return self.total("block_hits") / refs if refs else 0.0

    @property
    def token_hit_rate(self) -> float:
        prompt = self.total("prompt_tokens")
        return self.total("hit_tokens") / prompt if prompt else 0.0

    def by_tier(self, what: str) -> dict[str, int]:
        """``chunks`` or ``bytes`` loaded per tier, summed over engines."""
        out: dict[str, int] = {}
        for s in self.engines:
            for tier, n in getattr(s, f"{what}_loaded_by_tier").items():
                out[tier] = out.get(tier, 0) + n
        return out

    def imbalance(self) -> dict[str, float]:
        """Max over mean per engine of requests and of prefill tokens."""
        return {"requests": _imbalance([s.requests for s in self.engines]),
                "prefill_tokens": _imbalance([s.prompt_tokens - s.hit_tokens
                                              for s in self.engines])}

    def ttft(self) -> dict[str, dict[str, float]]:
        return ttft_percentiles([t for s in self.engines for t in s.ttft_samples])

    def as_dict(self) -> dict[str, Any]:
        n = max(1, self.total("requests"))
        return {
            "instances": len(self.engines), "router": self.router,
            "shared_slots": self.shared_slots,
            **{name: self.total(name) for name in _SUMMED},
            "block_hit_rate": self.block_hit_rate, "token_hit_rate": self.token_hit_rate,
            "chunks_loaded_by_tier": self.by_tier("chunks"),
            "bytes_loaded_by_tier": self.by_tier("bytes"),
            "imbalance": self.imbalance(),
            "mean_ttft_cold_s": sum(s.ttft_cold_s for s in self.engines) / n,
            "mean_ttft_s": sum(s.ttft_s for s in self.engines) / n,
            **self.ttft(),
            "wall_s": self.wall_s,
            "engines": [{**s.as_dict(), "prefill_tokens": s.prompt_tokens - s.hit_tokens,
                         **ttft_percentiles(s.ttft_samples)} for s in self.engines],
        }
