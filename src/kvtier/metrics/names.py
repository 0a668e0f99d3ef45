"""Every metric kvtier exports: its name, type, labels and meaning, in one table.

``docs/metrics.md`` documents each row, and a test checks that every metric a scrape shows
is one of these and is documented. The counters of a tier come from its ``TierStats``
(``kvtier.tiers.lower``), the planner's from its ``Metrics`` (``kvtier.planner``).

>>> TIER_COUNTERS["promoted"].name, TIER_COUNTERS["promoted"].labels
('kvtier_promotions_total', ('tier',))
>>> PLANNER_COUNTERS["waits"].name
'kvtier_planner_waits_total'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricKind = Literal["counter", "histogram"]

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)
"""Upper bounds (seconds) of the latency histograms' buckets; ``+Inf`` follows."""


@dataclass(frozen=True)
class Metric:
    """One exported metric family (a counter's name ends in ``_total``)."""

    name: str
    kind: MetricKind
    labels: tuple[str, ...]
    help: str


def _tier(name: str, text: str) -> Metric:
    return Metric(name, "counter", ("tier",), text)


TIER_COUNTERS: dict[str, Metric] = {
    "hits": _tier("kvtier_hits_total", "Chunks found and read: host, pinned for a load into "
                  "the engine; lower tiers, found and verified"),
    "misses": _tier("kvtier_misses_total", "Chunks asked of a lower tier and not held"),
    "stored": _tier("kvtier_chunks_stored_total", "Chunks written into the tier (host: "
                    "stores from the engine and promotions)"),
    "bytes_read": _tier("kvtier_bytes_loaded_total", "Bytes read out of the tier (host: "
                        "loaded into the engine, from the planner)"),
    "bytes_written": _tier("kvtier_bytes_stored_total", "Bytes written into the tier (host: "
                           "stored from the engine, from the planner)"),
    "promoted": _tier("kvtier_promotions_total", "Chunks this tier handed up to host memory"),
    "evicted": _tier("kvtier_evictions_total", "Chunks the tier dropped to make room"),
    "refused": _tier("kvtier_refusals_total", "Chunks the tier did not store (no room, disk "
                     "full, server down)"),
    "errors": _tier("kvtier_errors_total", "Failed calls (I/O or connection errors, timeouts, "
                    "failed host stores)"),
    "corrupt": _tier("kvtier_corrupt_chunks_total", "Chunks that failed verification, "
                     "dropped"),
    "skipped": _tier("kvtier_skipped_calls_total", "Calls not attempted while the tier backs "
                     "off after errors"),
    "foreign": _tier("kvtier_foreign_entries_total", "Entries where the tier keeps chunks "
                     "that it did not write, left untouched"),
}
"""``TierStats`` field -> its counter, labelled by tier."""

TIER_HISTOGRAMS: dict[str, Metric] = {
    "read": Metric("kvtier_load_seconds", "histogram", ("tier",),
                   "Time of one load from the tier (host: from pinning to the engine's "
                   "copy done; lower tiers: one batched read)"),
    "write": Metric("kvtier_store_seconds", "histogram", ("tier",),
                    "Time of one store into the tier (host: from reserving slots to "
                    "publishing; lower tiers: one batched write)"),
}
"""``TierStats`` latency (``"read"``, ``"write"``) -> its histogram, labelled by tier."""


def _planner(field: str, text: str, labels: tuple[str, ...] = ()) -> Metric:
    return Metric(f"kvtier_planner_{field}_total", "counter", labels, text)


PLANNER_COUNTERS: dict[str, Metric] = {
    "lookups": _planner("lookups", "Lookups by outcome (hit, miss, wait)", ("outcome",)),
    "hit_tokens_by_tier": _planner("hit_tokens", "Prompt tokens restored instead of "
                                   "computed", ("tier",)),
    "chunks_loaded": _planner("chunks_loaded", "Chunks loaded into the engine"),
    "bytes_loaded": _planner("bytes_loaded", "Bytes loaded into the engine"),
    "chunks_offered": _planner("chunks_offered", "Chunks store planning chose, before the "
                               "store skipped those it held"),
    "chunks_offered_by_group": _planner("chunks_offered_by_group", "Chunks store planning "
                                        "chose, per KV-cache group", ("group",)),
    "chunks_stored": _planner("chunks_stored", "Chunks stored from the engine"),
    "bytes_stored": _planner("bytes_stored", "Bytes stored from the engine"),
    "waits": _planner("waits", "Lookups answered wait (chunks still being written or "
                      "promoted)"),
    "deadline_expiries": _planner("deadline_expiries", "Waits that reached the deadline and "
                                  "took what was ready"),
    "store_refusals": _planner("store_refusals", "Store jobs the host tier refused"),
    "load_failures": _planner("load_failures", "Load jobs that failed (the request "
                              "recomputes)"),
    "store_failures": _planner("store_failures", "Store jobs that failed"),
    "corrupt_chunks_dropped": _planner("corrupt_chunks_dropped", "Chunks dropped after a "
                                       "failed load"),
}
"""Planner ``Metrics`` field -> its counter (a dict field's keys become the label)."""

PLANNER_SKIPPED = frozenset({"hit_tokens"})
"""Planner fields not exported on their own (``hit_tokens`` is the sum of its by-tier
counter)."""


def all_metrics() -> list[Metric]:
    """Every metric kvtier exports, in the order a scrape shows them."""
    return [*TIER_COUNTERS.values(), *TIER_HISTOGRAMS.values(), *PLANNER_COUNTERS.values()]
