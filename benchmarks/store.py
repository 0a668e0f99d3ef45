"""Store benchmark: per-operation cost of each eviction policy, and metadata per chunk.

One run measures, on the same request trace (batches of keys drawn from a skewed
popularity distribution over a universe larger than the store):

* lookups per second: ``ChunkStore.lookup`` of a batch, per key;
* cycles per second: one request through the paired protocol, i.e. lookup, then
  ``prepare_load``/``complete_load`` of the hits and ``prepare_store``/``complete_store``
  of the misses (evicting as needed), per key;

each against a bare ``OrderedDict`` LRU doing the same work in the same process, as a
ratio (the machine is shared and noisy; ratios are what we compare). The bare LRU is timed
in turns with each policy (``paired``), so that a policy's ratio is against a baseline run
under the same load, not one measured minutes earlier. And the store's
metadata per resident chunk, by tracemalloc, after the store is filled and churned (keys
are allocated by the caller, before tracing, and not counted; Belady's index of the future
is built before tracing too: it is a property of the trace, not of the resident chunks).

Targets (issue #3): the policies it asks for, LRU, ARC and S3-FIFO (``JUDGED``), within 4x
of the bare LRU per operation, and at most 256 bytes of metadata per resident chunk.
``pfreq`` (added later, by issue #9) is measured against the same targets and reported as
``met_pfreq``. Belady is measured too but not held to them: it is an offline yardstick
whose index of the future grows with the trace. The build (pure Python, or compiled with
mypyc: README, "Compiled build") is printed with the figures.
Prints a table, then as its last line one JSON object.

    python benchmarks/store.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from kvtier.buildinfo import describe
from kvtier.keys import ChunkKey
from kvtier.store import ONLINE_POLICIES, Belady, ChunkState, ChunkStore, Policy, StoreHandle

Batch = list[ChunkKey]
MAX_COST_RATIO = 4.0
MAX_METADATA_BYTES = 256.0
JUDGED = ("lru", "arc", "s3fifo")
"""The policies issue #3 asks for; its targets are judged on them (``met``)."""
READY, ABSENT = ChunkState.READY, ChunkState.ABSENT
"""Hoisted: reading an enum member off its class costs ~70 ns on Python 3.11, which in the
request loop's filters would be timed as the store's cost (a caller hoists them too)."""


def make_trace(num_keys: int, num_requests: int, batch: int, seed: int) -> list[Batch]:
    """Requests of ``batch`` distinct keys; key popularity ~ 1 / rank (Zipf, s = 1)."""
    rng = random.Random(seed)
    keys = [ChunkKey(rng.randbytes(40)) for _ in range(num_keys)]
    weights = [1.0 / (rank + 1) for rank in range(num_keys)]
    trace = []
    for _ in range(num_requests):
        picked = dict.fromkeys(rng.choices(keys, weights, k=batch))
        trace.append(list(picked))
    return trace


def make_policy_for(name: str, capacity: int, trace: Sequence[Batch]) -> str | Policy:
    if name == "belady":
        return Belady(capacity, future=[k for request in trace for k in request])
    return name


def store_request(store: ChunkStore, request: Batch) -> int:
    """One request through the protocol; returns how many keys hit."""
    states = store.lookup(request)
    hits = [k for k, s in zip(request, states, strict=True) if s is READY]
    misses = [k for k, s in zip(request, states, strict=True) if s is ABSENT]
    if hits:
        store.complete_load(store.prepare_load(hits))
    if misses:
        handle = store.prepare_store(misses)
        assert isinstance(handle, StoreHandle), handle
        store.complete_store(handle, ok=True)
    return len(hits)


def bare_request(lru: OrderedDict[ChunkKey, None], capacity: int, request: Batch) -> int:
    """The same request against a bare OrderedDict LRU."""
    hit = [k in lru for k in request]
    hits = [k for k, h in zip(request, hit, strict=True) if h]
    for k in hits:
        lru.move_to_end(k)
    for k, h in zip(request, hit, strict=True):
        if not h:
            if len(lru) >= capacity:
                lru.popitem(last=False)
            lru[k] = None
    return len(hits)


def paired(fns: Sequence[Callable[[], Any]], repeats: int) -> list[float]:
    """Best wall time of each of ``fns`` over ``repeats`` rounds, the functions taking turns
    within each round, so that the machine's noise hits them alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            gc.collect()
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


Workload = tuple[Callable[[], Any], Callable[[], Any], float]
"""A request loop through the paired protocol, a lookup loop, and the hit ratio."""


def policy_workload(name: str, capacity: int, trace: list[Batch]) -> Workload:
    num_keys = sum(map(len, trace))
    warm = ChunkStore(capacity, policy=make_policy_for(name, capacity, trace))
    hits = sum(store_request(warm, r) for r in trace)

    def cycles() -> None:
        store = ChunkStore(capacity, policy=make_policy_for(name, capacity, trace))
        for r in trace:
            store_request(store, r)

    def lookups() -> None:
        for r in trace:
            warm.lookup(r)

    return cycles, lookups, hits / num_keys


def bare_workload(capacity: int, trace: list[Batch]) -> Workload:
    num_keys = sum(map(len, trace))
    warm: OrderedDict[ChunkKey, None] = OrderedDict()
    hits = sum(bare_request(warm, capacity, r) for r in trace)

    def cycles() -> None:
        lru: OrderedDict[ChunkKey, None] = OrderedDict()
        for r in trace:
            bare_request(lru, capacity, r)

    def lookups() -> None:
        for r in trace:
            [k in warm for k in r]

    return cycles, lookups, hits / num_keys


def measure(name: str, capacity: int, trace: list[Batch], repeats: int) -> dict[str, float]:
    """A policy's cost per key, and the bare LRU's measured in turns with it."""
    num_keys = sum(map(len, trace))
    cycles, lookups, hit_ratio = policy_workload(name, capacity, trace)
    bare_cycles, bare_lookups, _ = bare_workload(capacity, trace)
    c, bc = paired([cycles, bare_cycles], repeats)
    lk, blk = paired([lookups, bare_lookups], repeats)
    return {"cycle_s": c / num_keys, "lookup_s": lk / num_keys, "hit_ratio": hit_ratio,
            "bare_cycle_s": bc / num_keys, "bare_lookup_s": blk / num_keys}


def measure_bare(capacity: int, trace: list[Batch], repeats: int) -> dict[str, float]:
    num_keys = sum(map(len, trace))
    cycles, lookups, hit_ratio = bare_workload(capacity, trace)
    c, lk = paired([cycles, lookups], repeats)
    return {"cycle_s": c / num_keys, "lookup_s": lk / num_keys, "hit_ratio": hit_ratio,
            "bare_cycle_s": c / num_keys, "bare_lookup_s": lk / num_keys}


def metadata_per_chunk(name: str, capacity: int, trace: list[Batch]) -> float:
    """Bytes traced while building, filling and churning a store, per resident chunk."""
    policy = make_policy_for(name, capacity, trace)
    gc.collect()
    tracemalloc.start()
    store = ChunkStore(capacity, policy=policy)
    for r in trace:
        store_request(store, r)
    gc.collect()
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert store.num_ready == capacity, "the trace must fill the store"
    return traced / store.num_ready


def bare_metadata_per_chunk(capacity: int, trace: list[Batch]) -> float:
    gc.collect()
    tracemalloc.start()
    lru: OrderedDict[ChunkKey, None] = OrderedDict()
    for r in trace:
        bare_request(lru, capacity, r)
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return traced / len(lru)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller trace (smoke test)")
    args = parser.parse_args()
    scale = 1 if args.quick else 4
    capacity = 2_000 * scale
    trace = make_trace(num_keys=20_000 * scale, num_requests=600 * scale, batch=64, seed=0)
    repeats = 3

    bare = measure_bare(capacity, trace, repeats)
    bare["metadata_bytes"] = bare_metadata_per_chunk(capacity, trace)
    results = {"bare_lru": bare}
    for name in (*ONLINE_POLICIES, "belady"):
        results[name] = measure(name, capacity, trace, repeats)
        results[name]["metadata_bytes"] = metadata_per_chunk(name, capacity, trace)
    sizes = metadata_sweep(scale)
    figures, met = report(results, capacity, trace)
    report_sweep(sizes)
    for name, by_cap in sizes.items():
        worst = max(by_cap.values())
        figures[f"{name}_metadata_bytes_worst"] = round(worst, 1)
        met[name] = met[name] and worst <= MAX_METADATA_BYTES
    targets = {"max_cost_ratio_vs_bare_lru": MAX_COST_RATIO,
               "max_metadata_bytes_per_resident_chunk": MAX_METADATA_BYTES,
               "metadata_capacities": list(METADATA_CAPACITIES),
               "applies_to": list(JUDGED)}
    print("met: " + ", ".join(f"{n} {'yes' if ok else 'no'}" for n, ok in met.items())
          + f" (judged on {', '.join(JUDGED)}; pfreq reported)")
    print(f"build: {describe()} (kvtier.buildinfo; README, \"Compiled build\")")
    print(json.dumps({"benchmark": "store", "build": describe(), "figures": figures,
                      "targets": targets, "met": all(met[n] for n in JUDGED),
                      "met_pfreq": met["pfreq"]}))


METADATA_CAPACITIES = (1_000, 3_000, 5_000, 8_000, 12_000)
"""Dicts and hash tables grow in powers of two, so bytes per chunk depend on where the
capacity falls between two sizes: the target is judged on the worst of these."""


def metadata_sweep(scale: int) -> dict[str, dict[int, float]]:
    """Metadata per resident chunk of each online policy at each capacity, on a trace
    four times the capacity in keys."""
    capacities = METADATA_CAPACITIES if scale > 1 else METADATA_CAPACITIES[:2]
    out: dict[str, dict[int, float]] = {name: {} for name in ONLINE_POLICIES}
    for cap in capacities:
        trace = make_trace(num_keys=4 * cap, num_requests=max(2_000, cap), batch=16, seed=1)
        for name in ONLINE_POLICIES:
            out[name][cap] = metadata_per_chunk(name, cap, trace)
    return out


def report_sweep(sizes: dict[str, dict[int, float]]) -> None:
    """The sweep's table, then the JSON line, judged on the worst capacity."""
    caps = sorted(next(iter(sizes.values())))
    print("\nmetadata bytes per resident chunk by capacity (chunks); the target is judged "
          "on the worst")
    print(f"{'policy':10}" + "".join(f"{c:>9,}" for c in caps) + f"{'worst':>9}")
    for name, by_cap in sizes.items():
        print(f"{name:10}" + "".join(f"{by_cap[c]:9.0f}" for c in caps)
              + f"{max(by_cap.values()):9.0f}")


def report(
    results: dict[str, dict[str, float]], capacity: int, trace: list[Batch]
) -> tuple[dict[str, float], dict[str, bool]]:
    """The main table; the figures and, per online policy, whether its cost and metadata
    targets hold."""
    mean = sum(map(len, trace)) / len(trace)
    print(f"store benchmark: capacity {capacity} chunks, {len(trace)} requests of "
          f"{mean:.0f} keys on average, Zipf(1) popularity")
    print(f"{'policy':10} {'hit ratio':>9} {'lookups/s':>12} {'cycles/s':>12} "
          f"{'lookup x':>9} {'cycle x':>8} {'meta B/chunk':>13}")
    figures: dict[str, float] = {}
    met: dict[str, bool] = {}
    for name, r in results.items():
        lx, cx = r["lookup_s"] / r["bare_lookup_s"], r["cycle_s"] / r["bare_cycle_s"]
        print(f"{name:10} {r['hit_ratio']:9.3f} {1 / r['lookup_s']:12,.0f} "
              f"{1 / r['cycle_s']:12,.0f} {lx:9.2f} {cx:8.2f} {r['metadata_bytes']:13.0f}")
        figures[f"{name}_lookups_per_s"] = round(1 / r["lookup_s"])
        figures[f"{name}_cycles_per_s"] = round(1 / r["cycle_s"])
        figures[f"{name}_hit_ratio"] = round(r["hit_ratio"], 4)
        figures[f"{name}_metadata_bytes_per_chunk"] = round(r["metadata_bytes"], 1)
        if name != "bare_lru":
            figures[f"{name}_lookup_cost_ratio"] = round(lx, 3)
            figures[f"{name}_cycle_cost_ratio"] = round(cx, 3)
        if name in ONLINE_POLICIES:
            ok = max(lx, cx) <= MAX_COST_RATIO and r["metadata_bytes"] <= MAX_METADATA_BYTES
            met[name] = met.get(name, True) and ok
    print("(rates are per key; 'x' columns are cost per operation relative to bare_lru)")
    return figures, met


if __name__ == "__main__":
    main()
