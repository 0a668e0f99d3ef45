"""What a replay counts, and the metrics derived from the counts.

Definitions (docs/replay.md):

* ``block_hit_rate``: trace block references found, over all block references. A request
  finds the blocks before the largest boundary (up to the end of its last named block, no
  ``prompt - 1`` cap) at which every group's required chunks are in the store when it
  arrives: for one full-attention group of 512-token chunks, the longest present run of
  its leading blocks (prefix semantics; each ``hash_ids`` entry is one chunk).
* ``token_hit_rate``: prompt tokens the planner restored (whole chunks, at most the prompt
  length minus one, every group's chunks present), over all prompt tokens.
* chunks and bytes per group: ``offered`` (what the planner chose to store: its store
  sets over the boundaries a producer serves, ``--boundaries``),
  ``dense`` (every whole chunk: what an offloader without the coverage contract offers),
  ``stored`` (new writes, after the store skipped chunks it holds) and ``loaded``.
* normalized hit rate (``normalized``, when LRU and Belady ran on the same settings):
  ``(r - r_LRU) / (r_Belady - r_LRU)``, so LRU is 0, the offline optimum 1.
* write amplification: bytes written to each tier (host: stores and promotions; disk:
  write-backs) per prompt token restored, ``bytes_written_per_hit_token``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvtier.layout import Group


@dataclass
class GroupCounts:
    """Chunk counts of one group (bytes follow from the group's chunk size)."""

    name: str
    kind: str
    bytes_per_chunk: int | None
    offered: int = 0
    dense: int = 0
    stored: int = 0
    loaded: int = 0

    @classmethod
    def of(cls, group: Group) -> GroupCounts:
        return cls(group.label, group.kind, group.bytes_per_chunk)

    def as_dict(self) -> dict[str, Any]:
        per = self.bytes_per_chunk
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        for what in ("offered", "dense", "stored", "loaded"):
            n = getattr(self, what)
            out[f"{what}_chunks"] = n
            out[f"{what}_bytes"] = None if per is None else n * per
        return out


@dataclass
class ReplayStats:
    """Totals of one replay (one policy, one set of capacities)."""

    policy: str
    slots: dict[str, int]
    """Slots per tier (``host``, and ``disk`` when modelled)."""
    groups: list[GroupCounts]
    """Chunk counts per KV-cache group, in the layout's order."""
    requests: int = 0
    block_refs: int = 0
    """Trace blocks the requests referenced."""
    block_hits: int = 0
    """Referenced blocks cached in some tier, by prefix (``driver.block_hit``)."""
    prompt_tokens: int = 0
    hit_tokens: int = 0
    """Prompt tokens restored by the planner's hits (whole chunks)."""
    hit_requests: int = 0
    chunks_loaded_by_tier: dict[str, int] = field(default_factory=dict)
    """Chunks the hits loaded, by the tier each was found in."""
    bytes_loaded_by_tier: dict[str, int] = field(default_factory=dict)
    store_refusals: int = 0
    """Stores the store refused (every slot pinned or offered)."""
    chunks_not_admitted: int = 0
    """Offered chunks admission declined (``--admit``): not stored."""
    chunks_written_by_tier: dict[str, int] = field(default_factory=dict)
    """Chunks each tier wrote (its STORED events: host stores and promotions, disk
    write-backs)."""
    bytes_written_by_tier: dict[str, int] = field(default_factory=dict)
    waits: int = 0
    """Lookups the planner answered WAIT (``--bytes``: promotions under way)."""
    ttft_cold_s: float = 0.0
    """Sum over requests of the modelled TTFT without the cache."""
    ttft_s: float = 0.0
    """Sum over requests of the modelled TTFT with the cache."""
    ttft_samples: list[tuple[float, float]] = field(default_factory=list, repr=False)
    """Each request's modelled TTFT without and with the cache, in the order computed
    (``add_ttft``; percentiles: ``kvtier.replay.fleet_stats``)."""
    wall_s: float = 0.0
    tiers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``--bytes`` only: per tier, the real store's counters (``bytes_run.tier_report``)."""
    verified_chunks: int = 0
    """``--bytes``: loaded chunks whose host slot read back exactly the bytes stored."""
    corrupt_chunks: int = 0
    """``--bytes``: loaded chunks whose slot did not (any is a kvtier bug)."""

    @property
    def block_hit_rate(self) -> float:
        return self.block_hits / self.block_refs if self.block_refs else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def add_ttft(self, cold_s: float, warm_s: float) -> None:
        """Count one request's modelled TTFT without (``cold_s``) and with the cache."""
        self.ttft_cold_s += cold_s
        self.ttft_s += warm_s
        self.ttft_samples.append((cold_s, warm_s))

    def add_written(self, tier: str, nbytes: int) -> None:
        """Count one chunk of ``nbytes`` written to ``tier``."""
        self.chunks_written_by_tier[tier] = self.chunks_written_by_tier.get(tier, 0) + 1
        self.bytes_written_by_tier[tier] = self.bytes_written_by_tier.get(tier, 0) + nbytes

    def written_per_hit_token(self) -> dict[str, float | None]:
        """Write amplification: bytes written to each tier per prompt token restored (None
        when nothing was restored)."""
        hit = self.hit_tokens
        return {t: n / hit if hit else None for t, n in self.bytes_written_by_tier.items()}

    def add_load(self, tier: str, chunks: int, nbytes: int) -> None:
        self.chunks_loaded_by_tier[tier] = self.chunks_loaded_by_tier.get(tier, 0) + chunks
        self.bytes_loaded_by_tier[tier] = self.bytes_loaded_by_tier.get(tier, 0) + nbytes

    def as_dict(self) -> dict[str, Any]:
        n = max(1, self.requests)
        return {
            "policy": self.policy,
            "slots": dict(self.slots),
            "requests": self.requests,
            "block_refs": self.block_refs,
            "block_hits": self.block_hits,
            "block_hit_rate": self.block_hit_rate,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "token_hit_rate": self.token_hit_rate,
            "prefill_tokens_saved": self.hit_tokens,
            "hit_requests": self.hit_requests,
            "chunks_loaded_by_tier": dict(self.chunks_loaded_by_tier),
            "bytes_loaded_by_tier": dict(self.bytes_loaded_by_tier),
            "store_refusals": self.store_refusals,
            "chunks_not_admitted": self.chunks_not_admitted,
            "chunks_written_by_tier": dict(self.chunks_written_by_tier),
            "bytes_written_by_tier": dict(self.bytes_written_by_tier),
            "bytes_written_per_hit_token": self.written_per_hit_token(),
            "waits": self.waits,
            "mean_ttft_cold_s": self.ttft_cold_s / n,
            "mean_ttft_s": self.ttft_s / n,
            "mean_ttft_saved_s": (self.ttft_cold_s - self.ttft_s) / n,
            "groups": [g.as_dict() for g in self.groups],
            "wall_s": self.wall_s,
            **({"tiers": self.tiers, "verified_chunks": self.verified_chunks,
                "corrupt_chunks": self.corrupt_chunks} if self.tiers else {}),
        }


RATES = ("block_hit_rate", "token_hit_rate")
"""The hit rates ``normalized`` puts on the LRU-to-Belady scale."""


def normalized(results: list[ReplayStats]) -> dict[str, dict[str, float | None]]:
    """Per policy and hit rate, ``(r - r_LRU) / (r_Belady - r_LRU)``: 0 is LRU, 1 the
    offline optimum (None where Belady does no better than LRU); empty unless both
    ``lru`` and ``belady`` are among ``results``.

    >>> def run(p, hits): return ReplayStats(p, {}, [], block_refs=4, block_hits=hits)
    >>> normalized([run("lru", 1), run("arc", 2), run("belady", 3)])["arc"]["block_hit_rate"]
    0.5
    """
    by = {s.policy: s for s in results}
    if "lru" not in by or "belady" not in by:
        return {}
    out: dict[str, dict[str, float | None]] = {}
    for s in results:
        out[s.policy] = {}
        for rate in RATES:
            low, high = getattr(by["lru"], rate), getattr(by["belady"], rate)
            out[s.policy][rate] = (getattr(s, rate) - low) / (high - low) if high > low else None
    return out
