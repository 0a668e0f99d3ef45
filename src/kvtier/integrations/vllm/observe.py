"""What the vLLM connector tells the world: its metrics and its KV cache events.

Metrics travel vLLM's connector-stats path. Once a step, vLLM asks the scheduler's connector
(and each worker's) for ``get_kv_connector_stats``; it sums the workers' and the
scheduler's with ``KvtierStats.aggregate``, ships the sum to the front end, and there hands
it to ``KvtierPromMetrics.observe`` (the counters and histograms on ``/metrics``, named and
documented as in ``kvtier.metrics.names``) and to its periodic log (``reduce``). So each
payload holds the increments since the previous call (``ConnectorStats.take``), never
totals: sums over workers and steps are then right.

KV events: every chunk kvtier stores or drops is published as vLLM's ``BlockStored`` /
``BlockRemoved`` with the medium vLLM's own offloading uses for that kind of tier
(``MEDIA``), so a KV-aware router counts host and disk hits as it counts vLLM's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

from kvtier.metrics.names import (
    LATENCY_BUCKETS_S,
    PLANNER_COUNTERS,
    TIER_COUNTERS,
    TIER_HISTOGRAMS,
    Metric,
    all_metrics,
)
from kvtier.metrics.payload import (
    LatencySamples,
    Payload,
    flatten,
    merge,
    snapshot,
    subtract,
    watch_latency,
)
from kvtier.store.results import EventKind, StoreEvent
from kvtier.tiers.lower import EventCounts, EventSource, TierStats

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from kvtier.integrations.vllm.scheduler import ConnectorScheduler
    from kvtier.integrations.vllm.worker_tiers import RankTiers
    from kvtier.planner import Metrics

MEDIA: dict[str, tuple[str, str]] = {
    "host": (MEDIUM_CPU, "LOCAL"),
    "disk": (MEDIUM_STORAGE, "LOCAL"),
    "redis": (MEDIUM_STORAGE, "REMOTE"),
}
"""kvtier tier -> (vLLM event medium, locality), as vLLM's offloading tiers publish them."""


def kv_event(event: StoreEvent, block_size: int) -> KVCacheEvent:
    """vLLM's event for one of kvtier's: the chunk's key is its block hash."""
    medium, locality = MEDIA.get(event.tier, (None, None))
    if event.kind is EventKind.STORED:
        return BlockStored(block_hashes=[event.key], parent_block_hash=None, token_ids=[],
                           block_size=block_size, lora_id=None, medium=medium,
                           lora_name=None, locality=locality)
    return BlockRemoved(block_hashes=[event.key], medium=medium, locality=locality)


class KvtierStats(KVConnectorStats):
    """A ``kvtier.metrics.payload`` of increments: summed across workers and steps."""

    data: Payload

    def reset(self) -> None:
        self.data.clear()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        self.data = merge(self.data, other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        return flatten(self.data)

    def is_empty(self) -> bool:
        return not self.data


class ConnectorStats:
    """One connector half's counters, handed out as increments (``take``): the scheduler's
    (host memory, from its store's events, and the planner's), or a worker's (its own disk
    and Redis tiers, and their latencies). vLLM sums the halves, so with tensor parallelism
    a lower tier's counts add every rank's shard.

    ``version`` is a number that moves whenever any counter may have (the scheduler's
    ``changes``, the tiers' ``TierStats.changes``); while it stands still ``take`` builds no
    snapshot, which is most steps of decoding."""

    def __init__(self, tiers: Callable[[], Mapping[str, Mapping[str, Any]]],
                 planner: Callable[[], Metrics] | None = None,
                 timed: Iterable[TierStats] = (),
                 version: Callable[[], int] | None = None) -> None:
        self._tiers, self._planner, self._version = tiers, planner, version
        self._latency = LatencySamples()
        timed = list(timed)
        self._timed = bool(timed)  # the scheduler's times nothing: no samples to drain
        watch_latency(timed, self._latency)
        self._last: Payload = {}
        self._seen: int | None = None

    @classmethod
    def of_scheduler(cls, scheduler: ConnectorScheduler) -> ConnectorStats:
        """Counts host stores and evictions from now on (the scheduler's store moves no
        bytes, so it times nothing)."""
        host, events = TierStats("host").snapshot(), EventCounts()
        scheduler.store.subscribe(events)
        return cls(lambda: {"host": {**host, **events.fields()}},
                   lambda: scheduler.planner.metrics,
                   version=partial(getattr, scheduler, "changes"))  # asked every step: no frame

    @classmethod
    def of_worker(cls, tiers: RankTiers | None) -> ConnectorStats | None:
        """A worker's lower tiers, or None for a worker without any."""
        if tiers is None:
            return None
        lower = list(tiers.lower)
        return cls(lambda: {t.name: t.stats.snapshot() for t in lower},
                   timed=[t.stats for t in lower],
                   version=lambda: sum(t.stats.changes for t in lower))

    def take(self) -> Payload:
        """What changed since the last call (empty when nothing did)."""
        # read before the snapshot: a count that lands in between moves it for next time
        version = None if self._version is None else self._version()
        if version is None or version != self._seen:
            now = snapshot(self._tiers(), None if self._planner is None else self._planner())
            # a version can move with no reported counter: compare before walking (in C)
            delta = {} if now == self._last else subtract(now, self._last)
            self._last, self._seen = now, version
        else:
            delta = {}
        if self._timed and (latency := self._latency.drain()):
            delta["latency"] = latency
        return delta


class RankEvents(KVConnectorKVEvents):
    """Worker -> scheduler, once a step: what each rank's lower tiers (disk) stored and
    dropped, as ``(rank, StoreEvent)``; vLLM joins the workers' with ``add_events``."""

    def __init__(self, events: list[Any] | None = None) -> None:
        self._events: list[Any] = list(events or [])
        self._num_workers = 1

    def add_events(self, events: list[Any]) -> None:
        self._events.extend(events)

    def aggregate(self) -> RankEvents:
        return self  # the scheduler's RankTally decides what every rank holds

    def increment_workers(self, count: int = 1) -> None:
        self._num_workers += count

    def get_all_events(self) -> list[Any]:
        return list(self._events)

    def get_number_of_workers(self) -> int:
        return self._num_workers

    def clear_events(self) -> None:
        self._events.clear()


class TierEventLog:
    """A worker's lower tiers' events (those that publish them: ``lower.EventSource``),
    kept until ``take``; they arrive on the tiers' own threads."""

    def __init__(self, tiers: RankTiers, rank: int) -> None:
        self.rank = rank
        self._events: list[tuple[int, StoreEvent]] = []
        self._lock = threading.Lock()
        for tier in tiers.lower:
            if isinstance(tier, EventSource):
                tier.subscribe(self._add)

    def _add(self, event: StoreEvent) -> None:
        with self._lock:
            self._events.append((self.rank, event))

    def take(self) -> RankEvents | None:
        with self._lock:
            events, self._events = self._events, []
        return RankEvents(events) if events else None


class RankTally:
    """Scheduler side: a chunk is in a lower tier once every rank holds its shard there, and
    gone once any rank dropped its shard; publishes exactly those transitions."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._ranks: dict[tuple[str, bytes], set[int]] = {}
        self.pending: list[StoreEvent] = []  # transitions not yet taken (read-only)

    def report(self, events: KVConnectorKVEvents | None) -> None:
        if not isinstance(events, RankEvents):
            return
        for rank, event in events.get_all_events():
            ranks = self._ranks.setdefault((event.tier, event.key), set())
            was_whole = len(ranks) == self.num_workers
            if event.kind is EventKind.STORED:
                ranks.add(rank)
            else:
                ranks.discard(rank)
            if (len(ranks) == self.num_workers) != was_whole:
                self.pending.append(event)
            if not ranks:
                del self._ranks[(event.tier, event.key)]

    def take(self) -> list[StoreEvent]:
        out, self.pending = self.pending, []
        return out


class KvtierPromMetrics(KVConnectorPromMetrics):
    """kvtier's metrics on vLLM's ``/metrics``: one counter or histogram per
    ``kvtier.metrics.names`` row, with vLLM's engine labels first."""

    def __init__(self, vllm_config: VllmConfig,
                 metric_types: dict[type[PromMetric], type[PromMetricT]],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        _unregister_earlier()
        self._metrics: dict[str, Any] = {}
        # vLLM types each of these classes as any of Gauge | Counter | Histogram (a TypeVar
        # bound to their union), so where prometheus_client ships its types a histogram's
        # ``buckets`` fails the type check against Gauge's; held as Any, the classes are
        # called as what they are (vLLM's choice: prometheus_client's own, or a wrapper).
        counter: Any = self._counter_cls
        histogram: Any = self._histogram_cls
        for metric in (*TIER_COUNTERS.values(), *PLANNER_COUNTERS.values()):
            self._metrics[metric.name] = counter(
                name=metric.name, documentation=metric.help, labelnames=self._labels(metric))
        for metric in TIER_HISTOGRAMS.values():
            self._metrics[metric.name] = histogram(
                name=metric.name, documentation=metric.help, labelnames=self._labels(metric),
                buckets=list(LATENCY_BUCKETS_S))

    def _labels(self, metric: Metric) -> list[str]:
        return [*self._labelnames, *metric.labels]

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        engine = self.per_engine_labelvalues[engine_idx]
        for tier, counts in transfer_stats_data.get("tiers", {}).items():
            for field, value in counts.items():
                self._inc(TIER_COUNTERS.get(field), [*engine, tier], value)
        for field, value in transfer_stats_data.get("planner", {}).items():
            metric = PLANNER_COUNTERS.get(field)
            if isinstance(value, dict):
                for label, count in value.items():
                    self._inc(metric, [*engine, str(label)], count)
            else:
                self._inc(metric, list(engine), value)
        for tier, ops in transfer_stats_data.get("latency", {}).items():
            for op, samples in ops.items():
                hist = self._metrics[TIER_HISTOGRAMS[op].name].labels(*engine, tier)
                for seconds in samples:
                    hist.observe(seconds)

    def _inc(self, metric: Metric | None, labels: list[object], value: float) -> None:
        if metric is not None and value > 0:  # counters only grow
            self._metrics[metric.name].labels(*labels).inc(value)


def _unregister_earlier() -> None:
    """Drop the kvtier metrics an earlier engine of this process registered globally (a
    second ``LLM`` would otherwise fail on duplicate names; vLLM does the same for its own,
    through the registry's private map, there being no public one)."""
    from prometheus_client import REGISTRY

    names = REGISTRY._names_to_collectors
    for metric in all_metrics():
        collector = names.get(metric.name)
        if collector is not None:
            REGISTRY.unregister(collector)
