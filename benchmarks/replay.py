"""Replay benchmark: the whole bundled trace with one policy, against a plain simulation.

One run measures, on the bundled Mooncake conversation trace (12,031 requests, 288,500
block references) for one full-attention group of 512-token chunks and LRU:

* ``refs_s``: keying every request's references once (``Workload``: ``ReplayChain``s
  over the block ids), shared by every policy a replay compares;
* ``replay_s``: the replay itself, through the real ``Planner`` and ``ChunkStore`` (each
  request keyed once: the planner takes the prompt's chain from its references);
* ``plain_s``: a straightforward ``OrderedDict`` LRU over the block ids, in the same
  process; ``ratio`` is ``(refs_s + replay_s) / plain_s`` (the machine is shared and noisy:
  compare ratios, not seconds).

Targets: the whole replay (references and one policy) in under 60 s, "seconds, not
minutes", and the replay's block hit count equal to the plain simulation's.

Admission (``admission_figures``): LRU that stores a chunk only at its second offer
within 4 offers per slot (``--admit 2``) against plain LRU, at 3,000 and 10,000 chunks:
block hit rate, chunks and bytes written to host memory (chunks of 64 MiB: 512 tokens of
128 KiB, Llama-3.1-8B's KV). Target: at 3,000 chunks at least twice LRU's hit rate
(the anchor: 6.5% against 13.5%) for under a quarter of its writes.
Normalized hit rates (``normalized_figures``): ``(r - r_LRU) / (r_Belady - r_LRU)`` of
every policy at ``--capacity`` chunks.
Fleet (``fleet_figures``): the first ``--fleet-requests`` requests (default 3,000) over
1, 4 and 8 engines of ``--capacity`` chunks each, under every router: fleet token hit rate,
load imbalance (max over mean prefill tokens) and modelled TTFT p90; ``--fleet-plot PATH``
draws the hit rate against engines per router (docs/fleet.png).
Memory (``memory_figures``): peak traced memory of an LRU replay, in total and per request,
streamed against holding the trace and its references (the replay before streaming), on
the bundled trace and a 10x synthetic one; target: streamed <= 0.2 x held at 10x.
Speed (``speed_figures``, issue 32): the README's default ``kvtier replay`` (a process of its
own, as a user runs it) in under ``README_TARGET_S`` with the figures recorded before the
replay was made faster (``README_FIGURES``: the hit rates must not move), the single-group
replay within ``RATIO_TARGET`` times the plain LRU (``ratio`` above), and a
1-million-request synthetic trace in under ``MILLION_TARGET_S``: measured on
``MILLION_MEASURED`` requests of the same generator and scaled linearly (process start
included, so the estimate is high).
Wall seconds are judged (CPU seconds are printed beside them: a shared machine's wall time
includes waiting for a core). ``--quick``: the first 3,000 requests, no memory figures and
no admission target (its anchor is the whole trace's), a smaller fleet table, and the
README run on its first 3,000 requests scaled to the whole trace (each scaled figure says
so). ``--jobs N``: worker processes for the independent replays (normalized, fleet).
Prints a table, then as its last line one JSON object.

    python benchmarks/replay.py [--quick] [--jobs N] [--capacity N] [--limit N]
                                [--fleet-plot docs/fleet.png]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from kvtier.layout import Group, Layout
from kvtier.replay import ReplayConfig, TraceRequest, Workload, read_trace, replay
from kvtier.replay.fleet import FleetOptions, replay_fleet
from kvtier.replay.parallel import Task, run_all
from kvtier.replay.policies import compared_policies
from kvtier.replay.routers import ROUTERS, parse_router
from kvtier.replay.stats import normalized
from kvtier.replay.sweep import pyplot
from kvtier.replay.synth import SynthConfig, synthetic_source
from kvtier.replay.trace import TraceSource, trace_source
from kvtier.replay.workload import count_requests
from kvtier.store.admission import Admission

MAX_TOTAL_S = 60.0
RATIO_TARGET = 10.0
README_TARGET_S = 5.0
MILLION_TARGET_S = 120.0
MILLION_MEASURED = {False: 100_000, True: 3_000}
"""Requests of the synthetic trace measured for the million-request estimate, by --quick."""
README_REQUESTS = 12031
README_FIGURES = {None: (0.10429809358752166, 0.1063647583916615),
                  3000: (0.09470472221188554, 0.0963704723382239)}
"""Block and token hit rates of the README's ``kvtier replay`` (the whole bundled trace, and
its first 3,000 requests), recorded on main before issue 32: the figures must not move."""
KV_BYTES_PER_TOKEN = 128 * 1024
ADMISSION_CAPACITIES = (3000, 10000)
FLEET_ENGINES = (1, 4, 8)


def plain_lru(requests: Sequence[TraceRequest], capacity: int) -> int:
    """Block hits of a plain LRU over block ids (prefix semantics)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for r in requests:
        for h in r.hash_ids:
            if h not in cache:
                break
            hits += 1
        for h in r.hash_ids:
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = None
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits


def admission_figures(workload: Workload) -> tuple[dict[str, dict[str, float]], bool]:
    """LRU with and without second-offer admission at ``ADMISSION_CAPACITIES``; whether
    admission meets its target at the first (module docstring)."""
    admitted = Workload(workload.source, dataclasses.replace(workload.config,
                                                              admission=Admission(2)))
    out: dict[str, dict[str, float]] = {}
    for capacity in ADMISSION_CAPACITIES:
        for name, w in (("lru", workload), ("lru_admit2", admitted)):
            s = replay(w, "lru", capacity)
            out[f"{name}@{capacity}"] = {
                "block_hit_rate": s.block_hit_rate, "token_hit_rate": s.token_hit_rate,
                "chunks_written": s.chunks_written_by_tier.get("host", 0),
                "bytes_written": s.bytes_written_by_tier.get("host", 0),
                "bytes_written_per_hit_token": s.written_per_hit_token().get("host") or 0.0}
    plain, admit = out[f"lru@{ADMISSION_CAPACITIES[0]}"], out[
        f"lru_admit2@{ADMISSION_CAPACITIES[0]}"]
    met = (admit["block_hit_rate"] >= 2 * plain["block_hit_rate"]
           and admit["bytes_written"] < plain["bytes_written"] / 4)
    return out, met


def normalized_figures(workload: Workload, capacity: int, jobs: int | None
                       ) -> dict[str, dict[str, float]]:
    """Every policy's hit rates and normalized hit rates at ``capacity`` chunks."""
    runs = run_all([Task(replay, (workload, p, capacity)) for p in compared_policies()], jobs)
    norm = normalized(runs)
    return {s.policy: {"block_hit_rate": s.block_hit_rate,
                       "normalized_block_hit_rate": norm[s.policy]["block_hit_rate"] or 0.0,
                       "normalized_token_hit_rate": norm[s.policy]["token_hit_rate"] or 0.0}
            for s in runs}


MEMORY_TARGET = 0.2
"""Streaming's peak at the 10x synthetic trace, as a fraction of holding it: the stream
holds the store (capacity-bounded) and one request, the held trace grows with its length."""


def memory_figures(capacity: int) -> dict[str, dict[str, float]]:
    """Peak traced memory (tracemalloc) of an LRU replay, in total and per request, for
    the bundled trace and a 10x synthetic one (2,000 users): streamed (``Workload`` over a
    source), against holding every request and its references first (the replay before
    streaming), in the same process."""
    config = ReplayConfig(Layout((Group("full", 512),)))
    out = {}
    for name, source in (("bundled", trace_source(None)),
                         ("synthetic_10x", synthetic_source(SynthConfig(users=2000)))):
        held = _peak(lambda s=source: _held(s, config, capacity))
        streamed = _peak(lambda s=source: replay(Workload(s, config), "lru", capacity))
        n = count_requests(source)
        out[name] = {"requests": n, "held_peak_mb": held / 2**20,
                     "streamed_peak_mb": streamed / 2**20, "held_bytes_per_request": held / n,
                     "streamed_bytes_per_request": streamed / n, "ratio": streamed / held}
    return out


def _held(source: TraceSource, config: ReplayConfig, capacity: int) -> object:
    """The replay before streaming: every request and its references listed, then
    replayed, the lists held throughout."""
    workload = Workload(source, config)
    listed = list(workload.items())
    replay(workload, "lru", capacity)
    return listed


def _peak(run: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def print_rows(title: str, rows: dict[str, dict[str, float]]) -> None:
    names = list(next(iter(rows.values())))
    print(f"\n{title}\n{'':<20}" + "".join(f"{n[:26]:>28}" for n in names))
    for row, values in rows.items():
        print(f"{row:<20}" + "".join(
            f"{values[n]:>28,.0f}" if values[n] >= 1000 else f"{values[n]:>28.4f}" for n in names))


def fleet_figures(requests: Sequence[TraceRequest], layout: Layout, capacity: int,
                  jobs: int | None) -> dict[str, dict[str, float]]:
    """Per router and engine count (``router@N``): the fleet's token hit rate, prefill
    imbalance and modelled TTFT p90 (the fleets replayed in ``jobs`` processes)."""
    workload = Workload(list(requests), ReplayConfig(layout))
    out: dict[str, dict[str, float]] = {}
    runs = [(router, n) for router in ROUTERS for n in FLEET_ENGINES]
    tasks = [Task(functools.partial(replay_fleet, options=FleetOptions(n, parse_router(r))),
                  (workload, "lru", capacity)) for r, n in runs]
    for (router, n), s in zip(runs, run_all(tasks, jobs), strict=True):
        out[f"{router}@{n}"] = {"engines": n, "token_hit_rate": s.token_hit_rate,
                                "imbalance_prefill": s.imbalance()["prefill_tokens"],
                                "ttft_p90_s": s.ttft()["ttft_s"]["p90"], "wall_s": s.wall_s}
    return out


def cli_replay(*argv: str) -> tuple[float, float, dict[str, Any]]:
    """Wall and CPU seconds (user and system) of a whole ``kvtier replay --json`` process
    (this interpreter), and its JSON. On a shared machine the wall time includes waiting
    for a core; the CPU time does not."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kvtier", "replay", "--json", *argv],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, json.loads(done.stdout)


def speed_figures(quick: bool) -> tuple[dict[str, Any], dict[str, bool]]:
    """The README's default run and the million-request estimate (module docstring)."""
    limit = 3000 if quick else None
    seconds, cpu, obj = cli_replay(*(["--limit", str(limit)] if limit else []))
    readme_s = seconds * README_REQUESTS / obj["requests"]
    unchanged = (obj["block_hit_rate"], obj["token_hit_rate"]) == README_FIGURES[limit]
    n = MILLION_MEASURED[quick]
    synth_s, synth_cpu, synth = cli_replay("--synthetic", f"users={n // 10},turns=10",
                                           "--limit", str(n))
    million_s = synth_s * 1_000_000 / synth["requests"]
    figures = {"readme_requests": obj["requests"], "readme_s": seconds, "readme_cpu_s": cpu,
               "readme_whole_trace_s": readme_s,
               "readme_whole_trace_cpu_s": cpu * README_REQUESTS / obj["requests"],
               "readme_scaled": limit is not None,
               "readme_block_hit_rate": obj["block_hit_rate"],
               "readme_token_hit_rate": obj["token_hit_rate"],
               "synthetic_requests": synth["requests"], "synthetic_s": synth_s,
               "synthetic_cpu_s": synth_cpu, "million_s_estimate": million_s,
               "million_cpu_s_estimate": synth_cpu * 1_000_000 / synth["requests"],
               "million_scaled_from": synth["requests"]}
    return figures, {"readme": readme_s <= README_TARGET_S, "figures_unchanged": unchanged,
                     "million": million_s <= MILLION_TARGET_S}


def plot_fleet(fleet: dict[str, dict[str, float]], path: str, title: str) -> None:
    """Fleet token hit rate against engines, one line per router."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for router in ROUTERS:
        rows = [fleet[f"{router}@{n}"] for n in FLEET_ENGINES]
        ax.plot(FLEET_ENGINES, [r["token_hit_rate"] for r in rows], marker="o", label=router)
    ax.set_xticks(FLEET_ENGINES)
    ax.set_xlabel("engines")
    ax.set_ylabel("fleet token hit rate")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=3000, help="host chunks (default 3000)")
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    parser.add_argument("--fleet-requests", type=int, default=3000,
                        help="requests of the fleet table (default 3000)")
    parser.add_argument("--fleet-plot", metavar="PATH", help="also plot the fleet table")
    parser.add_argument("--quick", action="store_true", help="a smaller run (module docstring)")
    parser.add_argument("--jobs", type=int, help="worker processes (default one per core)")
    args = parser.parse_args()
    if args.quick:
        args.limit, args.fleet_requests = args.limit or 3000, min(args.fleet_requests, 1000)
    requests = read_trace(limit=args.limit)
    t0 = time.perf_counter()
    layout = Layout((Group("full", 512, bytes_per_token=KV_BYTES_PER_TOKEN),))
    workload = Workload(requests, ReplayConfig(layout))
    t1 = time.perf_counter()
    stats = replay(workload, "lru", args.capacity)
    t2 = time.perf_counter()
    plain_hits = plain_lru(requests, args.capacity)
    t3 = time.perf_counter()
    refs_s, replay_s, plain_s = t1 - t0, t2 - t1, t3 - t2
    total = refs_s + replay_s
    figures = {"requests": len(requests), "block_refs": stats.block_refs,
               "refs_s": refs_s, "replay_s": replay_s, "total_s": total, "plain_s": plain_s,
               "ratio": total / plain_s, "block_hit_rate": stats.block_hit_rate,
               "token_hit_rate": stats.token_hit_rate,
               "plain_block_hit_rate": plain_hits / stats.block_refs}
    met = {"total_s": total <= MAX_TOTAL_S, "block_hits": stats.block_hits == plain_hits,
           "ratio": total / plain_s <= RATIO_TARGET}
    print(f"{'figure':<22}{'value':>14}")
    for name, value in figures.items():
        print(f"{name:<22}{value:>14.4f}" if isinstance(value, float) else f"{name:<22}{value:>14}")
    admission, admission_met = admission_figures(workload)
    if not args.quick:  # its anchor is the whole trace's
        met["admission"] = admission_met
    print_rows("admission (LRU, second offer within 4 offers per slot)", admission)
    norm = normalized_figures(workload, args.capacity, args.jobs)
    print_rows(f"normalized hit rates at {args.capacity} chunks", norm)
    if not args.quick:
        memory = memory_figures(args.capacity)
        print_rows("peak traced memory of an LRU replay: held trace against streamed", memory)
        met["memory"] = memory["synthetic_10x"]["ratio"] <= MEMORY_TARGET
    fleet = fleet_figures(requests[: args.fleet_requests], layout, args.capacity, args.jobs)
    print_rows(f"fleet: first {args.fleet_requests} requests, {args.capacity} chunks per engine",
               fleet)
    if args.fleet_plot:
        plot_fleet(fleet, args.fleet_plot, f"first {args.fleet_requests} requests of the "
                   f"bundled trace, {args.capacity} chunks of 512 tokens per engine, LRU")
    speed, speed_met = speed_figures(args.quick)
    met.update(speed_met)
    print(f"\nspeed (issue 32; {'--quick: scaled from a part' if args.quick else 'full'})")
    for name, value in speed.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{name:<26}{shown:>16}")
    print("targets met: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in met.items()))
    print(json.dumps({"benchmark": "replay", "quick": args.quick,
                      "figures": {**figures, "admission": admission, "normalized": norm,
                                  "fleet": fleet, "speed": speed, "met_by_target": met},
                      "targets": {"total_s": MAX_TOTAL_S, "block_hit_rate": "equal to plain",
                                  "ratio": f"<= {RATIO_TARGET} x the plain LRU",
                                  "readme_s": f"<= {README_TARGET_S} s, the whole trace",
                                  "figures_unchanged": "README hit rates as recorded",
                                  "million_s": f"<= {MILLION_TARGET_S} s for 1M requests",
                                  "admission": "at 3000 chunks: >= 2 x LRU's block hit rate, "
                                               "< 1/4 of its bytes written (not in --quick)",
                                  "memory": f"streamed peak <= {MEMORY_TARGET} x held, "
                                            "10x synthetic trace (not in --quick)"},
                      "met": all(met.values())}))


if __name__ == "__main__":
    main()
