"""Hit rate against host capacity: every policy over a range of sizes, as CSV, JSON, PNG.

The capacities run geometrically from the largest request (a smaller tier stores nothing
for it) to the trace's distinct chunks (where nothing is ever evicted); the infinite cache
is one flat line, the ceiling. matplotlib is imported only to draw (the ``plot`` extra).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvtier.replay.driver import Workload, replay
from kvtier.replay.parallel import Task, run_all
from kvtier.replay.policies import INFINITE
from kvtier.replay.stats import ReplayStats

Runner = Callable[..., ReplayStats]
"""``runner(workload, policy, host_slots, disk_slots, progress=)``: a module-level function
(it is pickled to the worker processes)."""
COLUMNS = ("policy", "host_slots", "host_bytes", "block_hit_rate", "token_hit_rate",
           "mean_ttft_saved_s")


def default_capacities(workload: Workload, points: int) -> list[int]:
    """``points`` host sizes in slots, geometric from the largest request to every chunk."""
    low = max(1, workload.max_request_chunks())
    high = max(low + 1, workload.num_distinct_chunks())
    if points < 2:
        raise ValueError(f"a sweep needs at least 2 points, got {points}")
    ratio = (high / low) ** (1 / (points - 1))
    return sorted({max(1, round(low * ratio**i)) for i in range(points)})


def run_sweep(
    workload: Workload, policies: Sequence[str], capacities: Sequence[int], disk_slots: int,
    bytes_per_slot: int | None, runner: Runner = replay,
    advance: Callable[[int], None] | None = None, *, jobs: int | None = 1,
) -> list[dict[str, Any]]:
    """One row per (policy, capacity), in that order; the infinite cache runs once. The
    replays run in ``jobs`` worker processes (``kvtier.replay.parallel``); ``advance`` counts
    the requests replayed."""
    runs = [(policy, slots) for policy in policies
            for slots in (capacities[:1] if policy == INFINITE else capacities)]
    results = run_all([Task(runner, (workload, policy, slots, disk_slots))
                       for policy, slots in runs], jobs, advance)
    return [_row(stats, policy, stats.slots["host"], bytes_per_slot)
            for (policy, _), stats in zip(runs, results, strict=True)]


def _row(stats: ReplayStats, policy: str, slots: int, per: int | None) -> dict[str, Any]:
    d = stats.as_dict()
    return {"policy": policy, "host_slots": slots,
            "host_bytes": None if per is None else slots * per,
            "block_hit_rate": d["block_hit_rate"], "token_hit_rate": d["token_hit_rate"],
            "mean_ttft_saved_s": d["mean_ttft_saved_s"]}


def write_outputs(rows: list[dict[str, Any]], meta: dict[str, Any], out_dir: Path) -> list[Path]:
    """``sweep.csv``, ``sweep.json`` and ``sweep.png`` in ``out_dir``; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path, png_path = (out_dir / f"sweep.{e}" for e in ("csv", "json", "png"))
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    json_path.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    plot(rows, meta, png_path)
    return [csv_path, json_path, png_path]


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files (ValueError naming the extra without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("the plot needs matplotlib: pip install 'kvtier[plot]'") from None
    return plt


def plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Block hit rate against host capacity, one line per policy, ceilings dashed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    xs = sorted({r["host_slots"] for r in rows})
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        if policy == INFINITE:
            ax.axhline(mine[0]["block_hit_rate"], color="black", ls="--", lw=1,
                       label=f"infinite cache ({mine[0]['block_hit_rate']:.3f})")
            continue
        style: dict[str, Any] = {"ls": ":", "color": "grey"} if policy == "belady" else {}
        ax.plot([r["host_slots"] for r in mine], [r["block_hit_rate"] for r in mine],
                marker="o", ms=3, label=policy + (" (offline optimum)" if style else ""),
                **style)
    _axes(ax, xs, meta)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _axes(ax: Any, xs: list[int], meta: dict[str, Any]) -> None:
    ax.set_xscale("log")
    per = meta.get("bytes_per_slot")
    unit = "host capacity (chunks)" if not per else (
        f"host capacity (chunks of {per / 2**20:.1f} MiB)")
    ax.set_xlabel(unit)
    ax.set_ylabel("block hit rate")
    ax.set_ylim(0, max(0.05, math.ceil(ax.get_ylim()[1] * 20) / 20))
    ax.set_xlim(xs[0] / 1.2, xs[-1] * 1.2)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"{meta.get('trace', 'trace')}: {meta.get('requests', '?')} requests, "
                 f"{meta.get('model', '')}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
