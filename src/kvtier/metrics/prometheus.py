"""kvtier's metrics through ``prometheus_client`` (the ``metrics`` extra).

``register(store, planner)`` adds a ``KvtierCollector`` to a ``CollectorRegistry`` (the
global one by default). The collector reads the store's counters (``TieredStore.stats()``)
and the planner's (``Planner.metrics``) when Prometheus scrapes, so no store call pays for
metrics; only the latency histograms are fed as calls are timed (``TierStats.watch``).

``prometheus_client`` is imported when a collector is made or scraped, never at import.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kvtier.metrics.names import (
    LATENCY_BUCKETS_S,
    PLANNER_COUNTERS,
    TIER_COUNTERS,
    TIER_HISTOGRAMS,
    Metric,
)
from kvtier.metrics.payload import LatencyHistograms, Payload, snapshot, watch_latency

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from kvtier.planner import Planner
    from kvtier.tiers.tiered import TieredStore


def prometheus_client() -> ModuleType:
    """The ``prometheus_client`` module, or an ImportError that names the extra to install."""
    try:
        return importlib.import_module("prometheus_client")
    except ImportError as e:
        raise ImportError(
            "kvtier's Prometheus metrics need prometheus_client: "
            "pip install 'kvtier[metrics]' (or pip install prometheus_client)") from e


class KvtierCollector:
    """A Prometheus collector over one ``TieredStore`` and, optionally, its ``Planner``."""

    def __init__(self, store: TieredStore, planner: Planner | None = None) -> None:
        self._prom = prometheus_client()
        self.store, self.planner = store, planner
        self.latency = LatencyHistograms()
        watch_latency([store.host_stats, *(t.stats for t in store.lower)], self.latency)

    def collect(self) -> Iterator[Any]:
        planner = None if self.planner is None else self.planner.metrics
        yield from families(snapshot(self.store.stats(), planner), self.latency.read())


def register(store: TieredStore, planner: Planner | None = None,
             registry: CollectorRegistry | None = None) -> KvtierCollector:
    """Register a ``KvtierCollector`` for ``store`` (and ``planner``) on ``registry`` (the
    global ``prometheus_client.REGISTRY`` by default); ``registry.unregister`` undoes it."""
    collector = KvtierCollector(store, planner)
    (registry or collector._prom.REGISTRY).register(collector)
    return collector


def families(payload: Payload,
             latency: Mapping[tuple[str, str], tuple[list[int], float, int]]) -> Iterator[Any]:
    """Metric families for a ``snapshot`` payload and cumulative latency histograms."""
    core = prometheus_client().metrics_core
    tiers: dict[str, dict[str, Any]] = payload.get("tiers", {})
    for field, metric in TIER_COUNTERS.items():
        family = _counter(core, metric)
        for tier, counts in tiers.items():
            family.add_metric([tier], counts[field])
        yield family
    for op, metric in TIER_HISTOGRAMS.items():
        hist = core.HistogramMetricFamily(metric.name, metric.help, labels=list(metric.labels))
        bounds = [*map(str, LATENCY_BUCKETS_S), "+Inf"]
        for (tier, kind), (cumulative, total, _) in sorted(latency.items()):
            if kind == op:
                hist.add_metric([tier], list(zip(bounds, cumulative, strict=True)), total)
        yield hist
    planner = payload.get("planner")
    if planner is not None:
        yield from _planner_families(core, planner)


def _planner_families(core: ModuleType, planner: Mapping[str, Any]) -> Iterator[Any]:
    for field, metric in PLANNER_COUNTERS.items():
        family = _counter(core, metric)
        value = planner[field]
        if isinstance(value, Mapping):
            for label, count in sorted(value.items(), key=lambda kv: str(kv[0])):
                family.add_metric([str(label)], count)
        else:
            family.add_metric([], value)
        yield family


def _counter(core: ModuleType, metric: Metric) -> Any:
    return core.CounterMetricFamily(metric.name, metric.help, labels=list(metric.labels))
