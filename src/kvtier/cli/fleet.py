"""``kvtier replay --instances N --router NAME [--shared BYTES] [--target METRIC=VALUE]``:
the fleet replay's flags, run and report (``kvtier.replay.fleet``; docs/replay.md).

``cli.replay`` parses the trace, layout and tiers as ever and hands a fleet replay here:
any of these flags makes one (``--instances 1`` gives the single-engine replay's figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from kvtier.cli.common import (
    UsageError,
    human_bytes,
    int_in,
    parse_bytes,
    positive_int,
    print_json,
    table,
)
from kvtier.replay.driver import Workload
from kvtier.replay.fleet import BELADY_NEEDS_ONE, MAX_INSTANCES, FleetOptions, replay_fleet
from kvtier.replay.fleet_stats import FleetStats
from kvtier.replay.parallel import Task, run_all
from kvtier.replay.progress import progress_bar
from kvtier.replay.routers import ROUTERS, RouterSpec, parse_router
from kvtier.replay.sweep import default_capacities
from kvtier.replay.target import Search, Target, parse_target, plan, plot

TARGET_POINTS = 8
"""Grid points of a target search, before bisection."""


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    fleet = parser.add_argument_group("fleet (any of these replays a fleet of engines)")
    fleet.add_argument("--instances", type=int_in(1, MAX_INSTANCES), metavar="N",
                       help="engines, each with the --host (and --disk) given (default 1)")
    fleet.add_argument("--router", metavar="NAME[:balance=X]",
                       help=f"which engine serves a request: {', '.join(ROUTERS)} (default "
                            "round_robin); prefix:balance=X weighs a token of load against a "
                            "token of prefill saved (default 1)")
    shared = fleet.add_mutually_exclusive_group()
    shared.add_argument("--shared", type=parse_bytes, metavar="BYTES",
                        help="a shared tier below every engine's own tiers, e.g. 4TiB")
    shared.add_argument("--shared-chunks", type=positive_int, metavar="N",
                        help="the shared tier as a number of chunk slots")
    fleet.add_argument("--target", metavar="METRIC=VALUE",
                       help="find the smallest capacity reaching it: token_hit=0.3, block_hit, "
                            "ttft_p50/p90/p99=SECONDS; host memory first, then the shared tier "
                            "(or disk); writes target.json and target.png to --out")


def fleet_requested(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.instances, args.router, args.shared,
                                       args.shared_chunks, args.target))


def check_fleet(args: argparse.Namespace, policies: list[str]) -> tuple[RouterSpec, Target | None]:
    """The router and target, and what a fleet replay cannot combine with; one-line errors."""
    for flag, value in (("--bytes", args.bytes), ("--sweep", args.sweep)):
        if value:
            raise UsageError(f"{flag} replays one engine: drop it, or drop the fleet flags "
                             "(--target sweeps a fleet's capacity)")
    if len(policies) != 1:
        raise UsageError("a fleet replay compares routers, not policies: give one --policy")
    if policies == ["belady"] and (args.instances or 1) > 1:
        raise UsageError(BELADY_NEEDS_ONE)
    try:
        router = parse_router(args.router or "round_robin")
        target = parse_target(args.target) if args.target is not None else None
    except ValueError as e:
        raise UsageError(str(e)) from None
    return router, target


def run_fleet(args: argparse.Namespace, workload: Workload, policies: list[str],
              tiers: dict[str, int], meta: dict[str, Any]) -> int:
    """The fleet replay, or the target search; ``tiers``: host, disk and shared slots."""
    router, target = check_fleet(args, policies)
    policy = policies[0]
    instances = args.instances or 1

    def run(host: int, disk: int, shared: int, show: bool = False) -> FleetStats:
        options = FleetOptions(instances, router, shared, args.concurrent)
        with progress_bar(len(workload.requests), str(router), enabled=show) as advance:
            try:
                return replay_fleet(workload, policy, host, disk, options=options,
                                    progress=advance)
            except ValueError as e:
                raise UsageError(str(e)) from None

    meta = {**meta, "instances": instances, "router": str(router), "policy": policy}
    if target is not None:
        options = FleetOptions(instances, router, tiers["shared"], args.concurrent)
        return _target(args, workload, target, tiers, run, meta, options)
    stats = run(tiers["host"], tiers["disk"], tiers["shared"], show=not args.json)
    if args.json:
        print_json({**meta, **stats.as_dict()})
    else:
        print(report(stats, meta))
    return 0


def _target(args: argparse.Namespace, workload: Workload, target: Target,
            tiers: dict[str, int], run: Any, meta: dict[str, Any],
            options: FleetOptions) -> int:
    grid = default_capacities(workload, TARGET_POINTS)
    host, disk, shared = tiers["host"], tiers["disk"], tiers["shared"]
    below = ("shared", lambda c: run(host, disk, c).as_dict()) if (args.instances or 1) > 1 \
        else ("disk", lambda c: run(host, c, shared).as_dict())

    def run_many(tier: str) -> Any:
        """The grid of ``tier`` in ``--jobs`` worker processes."""
        def each(capacities: Any) -> list[dict[str, Any]]:
            sizes = [(c, disk, shared) if tier == "host" else (host, disk, c)
                     if tier == "shared" else (host, c, shared) for c in capacities]
            tasks = [Task(fleet_figures, (workload, meta["policy"], h, d,
                                          dataclasses.replace(options, shared_slots=s)),
                          progress=False) for h, d, s in sizes]
            return run_all(tasks, args.jobs)
        return each

    searches = plan(target, [("host", lambda c: run(c, disk, shared).as_dict(), grid),
                             (below[0], below[1], grid)], run_many)
    found = searches[-1].answer
    per = meta["bytes_per_slot"]
    result = {**meta, "target": str(target), "reached": found is not None,
              "tier": searches[-1].tier if found is not None else None, "slots": found,
              "bytes": None if found is None or per is None else found * per,
              "best": searches[-1].best(target),
              "sweep": [r for s in searches for r in s.rows]}
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "target.json").write_text(json.dumps(result, indent=1) + "\n")
        plot(searches, target, f"{meta['trace']}: {meta['instances']} x {meta['router']}",
             out / "target.png")
    except (OSError, ValueError) as e:
        raise UsageError(f"--out {args.out}: {e}") from None
    if found is None:
        best = target.best([s.best(target) for s in searches])
        raise UsageError(f"--target {target}: unreachable; the best reached is {best:.4g} "
                         f"(host and {searches[-1].tier} up to {grid[-1]} slots)")
    if args.json:
        print_json(result)
        return 0
    print(_target_text(searches, target, result, per))
    return 0


def fleet_figures(workload: Workload, policy: str, host: int, disk: int,
                  options: FleetOptions) -> dict[str, Any]:
    """One fleet replay's ``as_dict`` (a worker process's task; ``UsageError`` for what
    the fleet refuses)."""
    try:
        return replay_fleet(workload, policy, host, disk, options=options).as_dict()
    except ValueError as e:
        raise UsageError(str(e)) from None


def _target_text(searches: list[Search], target: Target, result: dict[str, Any],
                 per: int | None) -> str:
    rows = [[r["tier"], f"{r['capacity']:,}", human_bytes(r["capacity"] * per) if per else "-",
             f"{r['figure']:.4f}", "yes" if target.met(r["figure"]) else ""]
            for s in searches for r in s.rows]
    size = f" ({human_bytes(result['bytes'])})" if result["bytes"] else ""
    return (f"target {target}: {result['tier']} {result['slots']:,} slots{size} per "
            f"{'engine' if result['tier'] != 'shared' else 'fleet'}\n\n"
            + table(["tier", "slots", "bytes", target.metric, "reached"], rows))


def report(stats: FleetStats, meta: dict[str, Any]) -> str:
    """The fleet's figures, then one row per engine."""
    d = stats.as_dict()
    head = (f"{meta['trace']}: {d['requests']} requests, {meta['model']}, {d['instances']} "
            f"engines, router {d['router']}, policy {meta['policy']}, {meta['mode']} replay")
    loaded = ", ".join(f"{t} {n:,}" for t, n in d["chunks_loaded_by_tier"].items()) or "none"
    fleet = table(["block hit", "token hit", "chunks loaded by tier", "imbalance req",
                   "imbalance prefill", "TTFT p50/p90/p99", "cold p50/p90/p99"],
                  [[f"{d['block_hit_rate']:.4f}", f"{d['token_hit_rate']:.4f}", loaded,
                    f"{d['imbalance']['requests']:.3f}", f"{d['imbalance']['prefill_tokens']:.3f}",
                    _pct(d["ttft_s"]), _pct(d["ttft_cold_s"])]])
    engines = table(["engine", "requests", "prefill tokens", "block hit", "token hit",
                     "loaded host", "loaded disk", "loaded shared", "TTFT p90"],
                    [[i, e["requests"], f"{e['prefill_tokens']:,}", f"{e['block_hit_rate']:.4f}",
                      f"{e['token_hit_rate']:.4f}"]
                     + [f"{e['chunks_loaded_by_tier'].get(t, 0):,}"
                        for t in ("host", "disk", "shared")]
                     + [f"{e['ttft_s']['p90']:.3f}s"] for i, e in enumerate(d["engines"])])
    return f"{head}\n\n{fleet}\n\n{engines}"


def _pct(p: dict[str, float]) -> str:
    return f"{p['p50']:.3f}/{p['p90']:.3f}/{p['p99']:.3f}s"
