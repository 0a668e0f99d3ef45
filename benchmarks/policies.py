"""Policies benchmark: block hit rate of every eviction policy on real and synthetic traffic.

Each trace is replayed through a metadata-only ``ChunkStore(num_slots, policy=...)`` with
the prefix semantics of ``kvtier replay``'s ``block_hit_rate``: a request hits the longest
run of its leading blocks present; then every block it names is refreshed (``touch``) or
stored (``prepare_store`` with each block's predecessor as its ``parents`` hint), in
order. Keys are the trace's block ids (an id names a block and its whole prefix), so one
full-attention group of 512-token chunks.

Reported, for every online policy of the registry, Belady (the offline optimum) and an
infinite cache:

* block hit rate over a capacity sweep of the bundled Mooncake conversation trace;
* ``gap_closed`` at 3,000 and 10,000 chunks: (best online - LRU) / (Belady - LRU);
* the same on each half of the trace, replayed cold (the policies were designed on the
  whole trace: the halves show the figures are not one lucky stretch);
* a synthetic multi-round workload (``kvtier.replay.synth``), its own sweep;
* cost per reference of each policy against plain LRU (target: within 4x), and
  tracemalloc bytes of metadata per resident chunk (target: at most 256).

Prints a table, then as its last line one JSON object. ``--plot FILE`` draws the sweep.

    python benchmarks/policies.py [--quick] [--plot docs/policies.png]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtier.keys import ChunkKey
from kvtier.store import ONLINE_POLICIES, Belady, ChunkState, ChunkStore, Policy, StoreHandle

Trace = list[list[ChunkKey]]
DEFAULT_TRACE = Path("/work/shared/data/mooncake/conversation_trace.jsonl")
SWEEP = (1_000, 2_000, 3_000, 5_000, 10_000, 20_000, 40_000)
HEADLINE = (3_000, 10_000)
MAX_COST_RATIO, MAX_METADATA_BYTES, MIN_GAP_CLOSED = 4.0, 256.0, 0.5
INFINITE = "infinite"
READY = ChunkState.READY


def load_trace(path: Path, limit: int | None = None) -> Trace:
    """Each request's block ids as 40-byte keys (id ``i`` -> ``i`` little-endian)."""
    with path.open() as f:
        lines = [json.loads(line)["hash_ids"] for line in f if line.strip()]
    return [[ChunkKey(h.to_bytes(40, "little")) for h in ids] for ids in lines[:limit]]


def build_policy(name: str, num_slots: int, trace: Trace) -> str | Policy:
    if name == "belady":
        return Belady(num_slots, future=[k for request in trace for k in request])
    return "lru" if name == INFINITE else name


def replay(trace: Trace, num_slots: int, name: str) -> float:
    """Block hit rate of ``name`` over ``num_slots`` slots (``infinite``: every block fits)."""
    if name == INFINITE:
        num_slots = len({k for request in trace for k in request}) + 1
    store = ChunkStore(num_slots, policy=build_policy(name, num_slots, trace))
    hits = refs = 0
    for request in trace:
        hits += serve(store, request)
        refs += len(request)
    return hits / refs


def serve(store: ChunkStore, request: list[ChunkKey]) -> int:
    """One request: its leading hits, then every block refreshed or stored, in order."""
    states = store.lookup(request)
    hit = 0
    while hit < len(states) and states[hit] is READY:
        hit += 1
    present = [k for k, s in zip(request, states, strict=True) if s is READY]
    if present:
        store.touch(present)
    handle = store.prepare_store(request, parents=[None, *request[:-1]])
    assert isinstance(handle, StoreHandle), handle
    store.complete_store(handle, ok=True)
    return hit


def sweep(trace: Trace, capacities: Sequence[int], names: Sequence[str]) -> dict[str, list[float]]:
    return {n: [round(replay(trace, c, n), 4) for c in capacities] for n in names}


def gap_closed(rates: dict[str, list[float]], online: Sequence[str], i: int) -> tuple[str, float]:
    """The best online policy at capacity index ``i`` and its share of the LRU-Belady gap."""
    best = max(online, key=lambda n: rates[n][i])
    lru, opt = rates["lru"][i], rates["belady"][i]
    return best, round((rates[best][i] - lru) / (opt - lru), 3) if opt > lru else 1.0


def cost_per_ref(trace: Trace, num_slots: int, name: str, repeats: int = 3) -> float:
    refs = sum(map(len, trace))
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        replay(trace, num_slots, name)
        best = min(best, time.perf_counter() - start)
    return best / refs


def metadata_per_chunk(trace: Trace, num_slots: int, name: str) -> float:
    """tracemalloc bytes per resident chunk once full (the keys are the caller's)."""
    policy = build_policy(name, num_slots, trace)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = ChunkStore(num_slots, policy=policy)
    for request in trace:
        serve(store, request)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / store.num_ready


QUICK_REQUESTS = 3000


def synthetic_trace(quick: bool) -> Trace:
    from kvtier.replay.synth import SynthConfig, generate

    requests = generate(SynthConfig(users=300 if quick else 1500, turns=6, seed=7))
    return [[ChunkKey(h.to_bytes(40, "little")) for h in r.hash_ids] for r in requests]


def plot(path: Path, capacities: Sequence[int], rates: dict[str, list[float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for name, ys in rates.items():
        style = {"belady": "k--", INFINITE: "k:"}.get(name, "-o")
        ax.plot(capacities, [100 * y for y in ys], style, label=name, markersize=4)
    ax.set_xscale("log")
    ax.set_xticks(list(capacities), [f"{c:,}" for c in capacities])
    ax.set_xlabel("store capacity (512-token chunks)")
    ax.set_ylabel("block hit rate (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def print_sweep(title: str, capacities: Sequence[int], rates: dict[str, list[float]]) -> None:
    print(f"\n{title}: block hit rate (%) by capacity (chunks)")
    print(f"{'policy':10}" + "".join(f"{c:>9,}" for c in capacities))
    for name, ys in rates.items():
        print(f"{name:10}" + "".join(f"{100 * y:9.1f}" for y in ys))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--quick", action="store_true",
                        help=f"headline capacities only, the trace's first {QUICK_REQUESTS:,} "
                        "requests, a 300-user synthetic trace (CI)")
    parser.add_argument("--plot", type=Path, help="write the sweep's plot here (PNG)")
    args = parser.parse_args()
    online = list(ONLINE_POLICIES)
    names = [*online, "belady", INFINITE]
    trace = load_trace(args.trace)
    if args.quick:
        trace = trace[:QUICK_REQUESTS]
    caps = HEADLINE if args.quick else SWEEP
    rates = sweep(trace, caps, names)
    print_sweep(f"{args.trace.name} ({len(trace)} requests)", caps, rates)

    figures: dict[str, Any] = {}
    met = True
    for c in HEADLINE:
        i = caps.index(c)
        best, share = gap_closed(rates, online, i)
        for n in names:
            figures[f"hit_rate_{n}_{c}"] = rates[n][i]
        figures[f"best_online_{c}"], figures[f"gap_closed_{c}"] = best, share
        met &= share >= MIN_GAP_CLOSED
    below = [f"{n}@{c}" for n in online for i, c in enumerate(caps)
             if rates[n][i] < rates["lru"][i]]
    figures["below_lru"] = below
    best_overall = max(online, key=lambda n: sum(rates[n]))
    figures["best_online"] = best_overall
    met &= not any(b.startswith(best_overall + "@") for b in below)

    half = len(trace) // 2
    for part, sub in (("first_half", trace[:half]), ("second_half", trace[half:])):
        part_rates = sweep(sub, HEADLINE, ["lru", best_overall, "belady"])
        print_sweep(f"{part} of the trace, replayed cold", HEADLINE, part_rates)
        for i, c in enumerate(HEADLINE):
            figures[f"{part}_gap_closed_{c}"] = gap_closed(part_rates, [best_overall], i)[1]

    synth = synthetic_trace(args.quick)
    distinct = len({k for r in synth for k in r})
    synth_caps = tuple(max(100, distinct * p // 100) for p in (2, 5, 10, 20, 40))
    synth_rates = sweep(synth, synth_caps, names)
    print_sweep(f"synthetic multi-round ({len(synth)} requests, {distinct} blocks)",
                synth_caps, synth_rates)
    for i, c in enumerate(synth_caps):
        figures[f"synthetic_gap_closed_{c}"] = gap_closed(synth_rates, online, i)[1]
    figures["synthetic_below_lru"] = [
        f"{n}@{c}" for n in online for i, c in enumerate(synth_caps)
        if synth_rates[n][i] < synth_rates["lru"][i]
    ]

    print("\ncost per block reference (3,000 chunks) and metadata per resident chunk")
    short = trace[:3000]
    lru_cost = cost_per_ref(short, 3000, "lru")
    for n in online:
        ratio = cost_per_ref(short, 3000, n) / lru_cost
        meta = metadata_per_chunk(short, 3000, n)
        print(f"{n:10} {ratio:6.2f}x lru {meta:8.0f} B/chunk")
        figures[f"{n}_cost_ratio"], figures[f"{n}_metadata_bytes"] = round(ratio, 2), round(meta)
        met &= ratio <= MAX_COST_RATIO and meta <= MAX_METADATA_BYTES
    figures["lru_us_per_ref"] = round(lru_cost * 1e6, 2)

    if args.plot:
        plot(args.plot, caps, rates, "Mooncake conversation trace, one full-attention group")
    targets = {"min_gap_closed": MIN_GAP_CLOSED, "never_below_lru": True,
               "max_cost_ratio_vs_lru": MAX_COST_RATIO,
               "max_metadata_bytes_per_chunk": MAX_METADATA_BYTES}
    print(json.dumps({"benchmark": "policies", "figures": figures, "targets": targets,
                      "met": bool(met)}))


if __name__ == "__main__":
    main()
