"""``kvtier replay``: replay a request trace for capacity planning (docs/replay.md).

With no arguments it replays the bundled Mooncake conversation trace for the default
model, with 64 GiB of host memory, LRU, dense boundaries and admission at a chunk's
second offer (``DEFAULT_ADMIT``). Everything printed comes from
``kvtier.replay``; this module parses arguments, sizes tiers and formats results.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

from kvtier.boundaries import BOUNDARY_MODES
from kvtier.cli.common import (
    Command,
    UsageError,
    add_layout_arguments,
    human_bytes,
    int_in,
    layout_from_args,
    parse_bytes,
    positive_int,
    print_json,
    table,
)
from kvtier.cli.fleet import add_fleet_arguments, check_fleet, fleet_requested, run_fleet
from kvtier.cli.replay_report import report
from kvtier.layout import Layout
from kvtier.replay.bytes_run import BytesOptions, check_options, replay_bytes
from kvtier.replay.concurrent import replay_concurrent
from kvtier.replay.driver import ReplayConfig, Workload, replay
from kvtier.replay.parallel import Task, run_all
from kvtier.replay.policies import compared_policies, known_policy
from kvtier.replay.progress import progress_bar
from kvtier.replay.refs import STORE_SCOPES
from kvtier.replay.sweep import default_capacities, run_sweep, write_outputs
from kvtier.replay.synth import SynthConfig, synthetic_source
from kvtier.replay.timing import TimingModel
from kvtier.replay.trace import (
    BLOCK_TOKENS,
    MAX_REQUEST_TOKENS,
    TraceError,
    TraceSource,
    trace_source,
    write_trace,
)
from kvtier.replay.workload import count_requests
from kvtier.store.admission import MAX_ADMIT_AFTER, MAX_WINDOW, WINDOW_PER_SLOT, Admission
from kvtier.tiers.host import check_fits_memory
from kvtier.tiers.redis.options import redact

DEFAULT_HOST = "64GiB"
DEFAULT_ADMIT = 2
"""``--admit`` for one engine: with ``lru`` and ``dense`` boundaries, the best online
combination measured on the bundled trace, its halves and the synthetic generator's traffic
(docs/replay.md, "Defaults")."""
DEFAULT_FLEET_ADMIT = 1
"""``--admit`` for more than one engine: a fleet holds N times the cache, where admission,
which always misses a chunk's second use, costs hits (docs/replay.md, "Defaults")."""
MAX_SWEEP_POINTS = 64
"""The most host sizes one ``--sweep`` runs (each runs every policy over the whole trace)."""
MAX_JOBS = 1024
"""The most worker processes ``--jobs`` starts (a bound on typos)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", nargs="?", metavar="TRACE",
                        help="a trace in Mooncake's format (.jsonl or .jsonl.gz); default: "
                             "the bundled Mooncake conversation trace")
    parser.add_argument("--synthetic", metavar="SPEC", nargs="?", const="",
                        help="replay a generated multi-round conversation trace instead; SPEC "
                             "is key=value,... over users, turns, system_prompts, system_tokens,"
                             " user_tokens, output_tokens, think_time_s, arrival_rate_per_s, "
                             "decode_tokens_per_s, seed")
    parser.add_argument("--save-trace", metavar="FILE",
                        help="also write the replayed requests to FILE (Mooncake format)")
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="replay only the first N requests")
    add_layout_arguments(parser)
    _add_tier_arguments(parser)
    parser.add_argument("--policy", metavar="NAME[,NAME]",
                        help=f"eviction policy, a list, or 'all': {', '.join(compared_policies())}"
                             " (default lru, plain recency; all with --sweep)")
    parser.add_argument("--store", choices=STORE_SCOPES, default="blocks",
                        help="what a request stores: every block the trace names (blocks, the "
                             "default) or only whole chunks of its prompt (prompt)")
    parser.add_argument("--boundaries", choices=BOUNDARY_MODES, default="dense",
                        help="which boundaries a producer serves (kvtier.boundaries): every one "
                             "(dense, the default), its prompt's end (end), or that and where it "
                             "was seen to share a prefix (shared); fewer store fewer "
                             "sliding-window chunks")
    _add_admission_arguments(parser)
    parser.add_argument("--block-tokens", type=int_in(1, MAX_REQUEST_TOKENS),
                        default=BLOCK_TOKENS, metavar="N",
                        help=f"tokens per trace block (default {BLOCK_TOKENS})")
    parser.add_argument("--timing", default="", metavar="SPEC",
                        help="time model, key=value,... over prefill_tokens_per_s, host_gb_per_s,"
                             " disk_gb_per_s, load_latency_ms, shared_gb_per_s, shared_latency_ms, "
                             "first_token_ms, "
                             "decode_tokens_per_s, prefill_slots")
    parser.add_argument("--concurrent", action="store_true",
                        help="replay at the trace's timestamps, prefill and decoding overlapping")
    parser.add_argument("--sweep", type=int_in(2, MAX_SWEEP_POINTS), nargs="?", const=8,
                        metavar="POINTS",
                        help=f"sweep host capacity (POINTS sizes, 2 to {MAX_SWEEP_POINTS}, default"
                             " 8) for every policy and write sweep.csv, sweep.json and sweep.png "
                             "to --out")
    parser.add_argument("--out", default="replay-sweep", metavar="DIR",
                        help="directory for --sweep outputs (default ./replay-sweep)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (no progress bar, no table)")
    parser.add_argument("--jobs", type=int_in(1, MAX_JOBS), metavar="N",
                        help="worker processes for independent replays (several policies, "
                             "--sweep, --target's grid; default one per core); the figures "
                             "are the same for any N")
    add_fleet_arguments(parser)


def _add_admission_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admit", type=int_in(1, MAX_ADMIT_AFTER), metavar="N",
                        help="admission: store a chunk only at its N-th offer within the window "
                             f"(default {DEFAULT_ADMIT} for one engine, {DEFAULT_FLEET_ADMIT} "
                             "for --instances above 1: the best measured, docs/replay.md "
                             "'Defaults'; 1: every offer, no admission)")
    parser.add_argument("--admit-window", type=int_in(1, MAX_WINDOW), metavar="OFFERS",
                        help=f"offers admission remembers (default {WINDOW_PER_SLOT} per host "
                             "slot)")


def _add_tier_arguments(parser: argparse.ArgumentParser) -> None:
    host = parser.add_mutually_exclusive_group()
    host.add_argument("--host", type=parse_bytes, metavar="BYTES",
                      help=f"host memory for the cache, e.g. 64GiB (default {DEFAULT_HOST})")
    host.add_argument("--host-chunks", type=positive_int, metavar="N",
                      help="host memory as a number of chunk slots")
    disk = parser.add_mutually_exclusive_group()
    disk.add_argument("--disk", type=parse_bytes, metavar="BYTES",
                      help="a disk tier below host memory (modelled, metadata only), e.g. 1TiB")
    disk.add_argument("--disk-chunks", type=positive_int, metavar="N",
                      help="the disk tier as a number of chunk slots")
    parser.add_argument("--bytes", action="store_true",
                        help="replay on a real TieredStore (host slab, disk files, Redis), "
                             "writing and verifying every chunk's bytes")
    parser.add_argument("--slot-bytes", type=parse_bytes, metavar="BYTES",
                        help="with --bytes: bytes each slot really holds (default 4KiB; "
                             "capacities still count the layout's real chunk bytes)")
    parser.add_argument("--disk-dir", metavar="DIR",
                        help="with --bytes: the disk tier's directory (default: a temporary "
                             "one, removed at the end)")
    parser.add_argument("--redis", metavar="URL",
                        help="with --bytes: a Redis tier at URL (redis://host:port/db) below")


def _slots(layout: Layout, nbytes: int | None, chunks: int | None, flag: str) -> int:
    if chunks is not None:
        return chunks
    if nbytes is None:
        return 0
    per = layout.max_bytes_per_chunk
    if per is None:
        raise UsageError(f"{flag}: the layout gives no bytes per token, so bytes cannot be "
                         f"converted to chunks; give {flag}-chunks N instead")
    slots = nbytes // per
    if slots < 1:
        raise UsageError(f"{flag} {human_bytes(nbytes)} holds no chunk of {human_bytes(per)}")
    return slots


def _requests(args: argparse.Namespace) -> tuple[TraceSource, str, int]:
    """The trace to stream, its name, and its requests, counted by a first pass that
    checks every line (so that a bad one stops the run before it starts)."""
    try:
        if args.synthetic is not None:
            if args.trace:
                raise UsageError("give a TRACE or --synthetic, not both")
            source = synthetic_source(SynthConfig.parse(args.synthetic), args.block_tokens,
                                      args.limit)
            name = "synthetic"
        else:
            source = trace_source(args.trace, block_tokens=args.block_tokens, limit=args.limit)
            name = Path(args.trace).name if args.trace else "mooncake conversation (bundled)"
        count = count_requests(source)
    except (TraceError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.save_trace:
        try:
            write_trace(source(), args.save_trace)
        except OSError as e:
            raise UsageError(f"--save-trace {args.save_trace}: cannot write a trace file there "
                             f"({e.strerror or e}); give a file in an existing directory") from None
    return source, name, count


def _policies(text: str) -> list[str]:
    if text == "all":
        return compared_policies()
    try:
        names = [known_policy(p.strip()) for p in text.split(",") if p.strip()]
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not names:
        raise UsageError(f"--policy {text!r} names no policy; give one or more of "
                         f"{', '.join(compared_policies())}, or 'all'")
    return names


def run(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    try:
        timing = TimingModel.parse(args.timing)
    except ValueError as e:
        raise UsageError(str(e)) from None
    policies = _policies(args.policy or ("all" if args.sweep else "lru"))
    if fleet_requested(args):
        check_fleet(args, policies)  # before the trace is read
    host_bytes = args.host if args.host is not None or args.host_chunks else parse_bytes(
        DEFAULT_HOST)
    host = _slots(layout, host_bytes, args.host_chunks, "--host")
    disk = _slots(layout, args.disk, args.disk_chunks, "--disk")
    bytes_options = _bytes_options(args, policies, disk)
    if bytes_options is not None:
        _check_slab(host, bytes_options.slot_bytes)
    if args.admit is None:
        args.admit = DEFAULT_FLEET_ADMIT if (args.instances or 1) > 1 else DEFAULT_ADMIT
    source, name, count = _requests(args)
    config = ReplayConfig(layout, args.block_tokens, args.store, timing, args.boundaries,
                          Admission(args.admit, args.admit_window))
    show = not args.json
    with progress_bar(count, "hashing", enabled=show) as advance:
        workload = Workload(source, config, advance)
        if args.sweep or {"belady", "infinite"} & set(policies):
            workload.summary()  # the first pass: Belady's future, the distinct chunks
    meta = {"trace": name, "requests": count, "model": layout.model,
            "bytes_per_slot": layout.max_bytes_per_chunk, "store": args.store,
            "boundaries": args.boundaries, "admit_after": args.admit,
            "admit_window": args.admit_window,
            "mode": "concurrent" if args.concurrent else "sequential",
            "timing": vars(timing)}
    runner: Any = replay_concurrent if args.concurrent else replay
    if bytes_options is not None:
        runner = functools.partial(replay_bytes, options=bytes_options)
        meta["bytes"] = {"slot_bytes": bytes_options.slot_bytes,
                         "disk_dir": bytes_options.disk_dir,
                         "redis": bytes_options.redis_url and redact(bytes_options.redis_url)}
    if fleet_requested(args):
        shared = _slots(layout, args.shared, args.shared_chunks, "--shared")
        return run_fleet(args, workload, policies, {"host": host, "disk": disk,
                                                    "shared": shared}, meta)
    if args.sweep:
        return _sweep(args, workload, policies, disk, meta, runner, count)
    tasks = [Task(runner, (workload, policy, host, disk)) for policy in policies]
    jobs = 1 if bytes_options is not None else args.jobs  # --bytes: one set of real tiers
    with progress_bar(count * len(tasks), ",".join(policies), enabled=show) as advance:
        results = run_all(tasks, jobs, advance)
    report(args, meta, results)
    return 0


def _bytes_options(
    args: argparse.Namespace, policies: list[str], disk: int
) -> BytesOptions | None:
    """``--bytes`` and its options, checked (one-line errors), or None without it."""
    extra = [f for f, v in (("--slot-bytes", args.slot_bytes), ("--disk-dir", args.disk_dir),
                            ("--redis", args.redis)) if v is not None]
    if not args.bytes:
        if extra:
            raise UsageError(f"{' and '.join(extra)} {'needs' if len(extra) == 1 else 'need'}"
                             " --bytes")
        return None
    if args.concurrent or args.sweep:
        raise UsageError("--bytes replays sequentially at given capacities: drop "
                         + ("--concurrent" if args.concurrent else "--sweep"))
    if args.disk_dir is not None and not disk:
        raise UsageError("--disk-dir needs a disk tier: give --disk BYTES or --disk-chunks N")
    try:
        slot_bytes = 4096 if args.slot_bytes is None else args.slot_bytes
        options = BytesOptions(slot_bytes, args.disk_dir, args.redis)
        check_options(options, policies, bool(disk))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return options


def _check_slab(host_slots: int, slot_bytes: int) -> None:
    """``--bytes`` allocates ``host_slots`` real slots: refuse, before, what cannot fit."""
    try:
        check_fits_memory(host_slots * slot_bytes,
                          f"--bytes: the host slab ({host_slots} slots of --slot-bytes "
                          f"{human_bytes(slot_bytes)})")
    except ValueError as e:
        raise UsageError(str(e)) from None


def _sweep(args: argparse.Namespace, workload: Workload, policies: list[str], disk: int,
           meta: dict[str, Any], runner: Any, count: int) -> int:
    capacities = default_capacities(workload, args.sweep)
    total = sum(1 if p == "infinite" else len(capacities) for p in policies)
    with progress_bar(total * count, "sweep", enabled=not args.json) as advance:
        rows = run_sweep(workload, policies, capacities, disk, meta["bytes_per_slot"],
                         runner, advance, jobs=args.jobs)
    try:
        paths = write_outputs(rows, meta, Path(args.out))
    except (OSError, ValueError) as e:
        raise UsageError(f"--out {args.out}: {e}") from None
    if args.json:
        print_json({**meta, "rows": rows, "files": [str(p) for p in paths]})
        return 0
    headers = ["policy", "host chunks", "host bytes", "block hit", "token hit"]
    print(table(headers, [[r["policy"], r["host_slots"], human_bytes(r["host_bytes"]),
                           f"{r['block_hit_rate']:.4f}", f"{r['token_hit_rate']:.4f}"]
                          for r in rows]))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


COMMAND = Command("replay", "Replay a request trace through kvtier for capacity planning.",
                  add_arguments, run)
