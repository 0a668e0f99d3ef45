"""kvtier's counters as plain data, and the cheap latency watchers; no Prometheus here.

A *payload* is a nested dict of numbers, the form both the library's collector and the vLLM
connector's stats read::

    {"tiers":   {tier: {TierStats field: number}},
     "planner": {Metrics field: number or {label value: number}},
     "latency": {tier: {"read" or "write": [seconds, ...]}}}   (vLLM's per-step stats only)

``snapshot`` takes one from a store's ``stats()`` and a planner's ``Metrics``; ``subtract``
turns two snapshots into what happened between them (vLLM wants each step's increments);
``merge`` adds payloads (vLLM sums them across workers and steps).

>>> a = {"tiers": {"host": {"hits": 2}}, "latency": {"host": {"read": [0.1]}}}
>>> b = {"tiers": {"host": {"hits": 3, "stored": 1}}, "latency": {"host": {"read": [0.2]}}}
>>> merge(a, b)
{'tiers': {'host': {'hits': 5, 'stored': 1}}, 'latency': {'host': {'read': [0.1, 0.2]}}}
>>> subtract({"tiers": {"host": {"hits": 5, "stored": 1}}}, {"tiers": {"host": {"hits": 5}}})
{'tiers': {'host': {'stored': 1}}}
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kvtier.metrics.names import LATENCY_BUCKETS_S, PLANNER_COUNTERS, TIER_COUNTERS

if TYPE_CHECKING:
    from kvtier.planner import Metrics
    from kvtier.tiers.lower import LatencyWatcher, TierStats

Payload = dict[str, Any]
MAX_SAMPLES = 4096
"""Latency samples kept between two drains of ``LatencySamples`` (the rest are dropped)."""


def snapshot(tiers: Mapping[str, Mapping[str, Any]], planner: Metrics | None = None) -> Payload:
    """The counters of ``tiers`` (``TieredStore.stats()``) and of ``planner``; the host
    tier's bytes are the planner's bytes loaded into and stored from the engine."""
    out: Payload = {"tiers": {t: {f: snap[f] for f in TIER_COUNTERS} for t, snap in tiers.items()}}
    if planner is not None:
        # only the counters reported, each dict copied (``Metrics.as_dict`` copies them all)
        out["planner"] = {f: dict(v) if isinstance(v := getattr(planner, f), dict) else v
                          for f in PLANNER_COUNTERS}
        host = out["tiers"].get("host")
        if host is not None:
            host["bytes_read"], host["bytes_written"] = planner.bytes_loaded, planner.bytes_stored
    return out


def subtract(now: Mapping[str, Any], before: Mapping[str, Any]) -> Payload:
    """``now - before`` per number (nested); entries that did not change are left out."""
    out: Payload = {}
    for k, v in now.items():
        if isinstance(v, dict):  # payloads are dicts; an ABC check costs more, once a step
            diff: Any = subtract(v, before.get(k) or {})
        elif isinstance(v, list):
            diff = list(v)
        else:
            diff = v - before.get(k, 0)
        if diff:
            out[k] = diff
    return out


def merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> Payload:
    """``a + b``: numbers added, dicts merged, sample lists joined (neither is changed)."""
    out: Payload = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in a.items()}
    for k, v in b.items():
        mine = out.get(k)
        if mine is None:
            out[k] = v
        elif isinstance(v, Mapping):
            out[k] = merge(mine, v)
        else:
            out[k] = mine + v
    return out


def flatten(payload: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """One number per leaf, named by its path (``tiers.disk.hits``); a sample list becomes
    its count (``latency.disk.read.count``) and mean (``...mean_ms``)."""
    out: dict[str, float] = {}
    for k, v in payload.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, name + "."))
        elif isinstance(v, list):
            out[name + ".count"] = len(v)
            out[name + ".mean_ms"] = round(1e3 * sum(v) / len(v), 3) if v else 0.0
        else:
            out[name] = v
    return out


def watch_latency(stats: Iterable[TierStats], callback: LatencyWatcher) -> None:
    """Have each of ``stats`` report its timed calls to ``callback``."""
    for s in stats:
        s.watch(callback)


class LatencyHistograms:
    """Cumulative latency histograms per (tier, ``"read"``/``"write"``), fed by
    ``TierStats.watch``: a bisect and three additions per timed call.

    >>> h = LatencyHistograms((0.001, 0.01))
    >>> h("disk", "read", 0.005); h("disk", "read", 0.5)
    >>> h.read()[("disk", "read")]
    ([0, 1, 2], 0.505, 2)
    """

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self._counts: dict[tuple[str, str], list[int]] = {}
        self._sums: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def __call__(self, tier: str, op: str, seconds: float) -> None:
        i = bisect.bisect_left(self.buckets, seconds)
        with self._lock:
            counts = self._counts.setdefault((tier, op), [0] * (len(self.buckets) + 1))
            counts[i] += 1
            self._sums[(tier, op)] = self._sums.get((tier, op), 0.0) + seconds

    def read(self) -> dict[tuple[str, str], tuple[list[int], float, int]]:
        """Per (tier, op): cumulative counts per bucket (the last is ``+Inf``), sum, count."""
        with self._lock:
            out = {}
            for key, counts in self._counts.items():
                cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
                out[key] = (cumulative, round(self._sums[key], 9), cumulative[-1])
            return out


class LatencySamples:
    """Latency samples since the last ``drain`` (at most ``MAX_SAMPLES``), fed by
    ``TierStats.watch``; the vLLM connector sends them once a step.

    >>> s = LatencySamples(); s("host", "write", 0.25)
    >>> s.drain(), s.drain()
    ({'host': {'write': [0.25]}}, {})
    """

    def __init__(self) -> None:
        self._samples: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()

    def __call__(self, tier: str, op: str, seconds: float) -> None:
        with self._lock:
            if len(self._samples) < MAX_SAMPLES:
                self._samples.append((tier, op, seconds))

    def drain(self) -> dict[str, dict[str, list[float]]]:
        if not self._samples:  # most steps: no lock taken (a sample landing now waits a step)
            return {}
        with self._lock:
            samples, self._samples = self._samples, []
        out: dict[str, dict[str, list[float]]] = {}
        for tier, op, seconds in samples:
            out.setdefault(tier, {}).setdefault(op, []).append(seconds)
        return out
