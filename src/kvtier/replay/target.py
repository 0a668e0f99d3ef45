"""Planning to a target: the smallest capacity at which a replay reaches a figure
(``kvtier replay --target token_hit=0.3``; docs/replay.md).

A target is a metric and a value: ``token_hit`` or ``block_hit`` (a rate to reach, at
least), or ``ttft_p50``, ``ttft_p90``, ``ttft_p99`` (the modelled time to first token's
percentile, seconds, at most). ``search`` runs the replay at a geometric grid of capacities
(``sweep.default_capacities``) in increasing order, stops at the first that reaches the
target, and bisects the integer capacities between it and the grid point before: the answer
is the smallest capacity that reaches the target wherever the figure is monotone in
capacity (LRU's is, as a stack algorithm). ``plan`` searches host memory first, then the
tier below it, with host memory as given.

>>> parse_target("token_hit=0.3")
Target(metric='token_hit', value=0.3)
>>> Target("ttft_p90", 2.0).reached({"ttft_s": {"p90": 1.5}})
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.replay.sweep import pyplot

METRICS: dict[str, tuple[Callable[[dict[str, Any]], float], bool]] = {
    "token_hit": (lambda d: d["token_hit_rate"], True),
    "block_hit": (lambda d: d["block_hit_rate"], True),
    "ttft_p50": (lambda d: d["ttft_s"]["p50"], False),
    "ttft_p90": (lambda d: d["ttft_s"]["p90"], False),
    "ttft_p99": (lambda d: d["ttft_s"]["p99"], False),
}
"""Metric -> (its value in a fleet replay's ``as_dict``, whether higher is better)."""
MAX_SECONDS = 1e9
"""The largest TTFT target."""


@dataclass(frozen=True)
class Target:
    metric: str
    value: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"--target: unknown metric {self.metric!r}; known: "
                             f"{', '.join(METRICS)}")
        rate = METRICS[self.metric][1]
        high = 1.0 if rate else MAX_SECONDS
        if not (isinstance(self.value, (int, float)) and math.isfinite(self.value)
                and 0 < self.value <= high):
            raise ValueError(f"--target {self.metric} must be a number in (0, {high:g}], got "
                             f"{self.value!r}")

    def figure(self, result: dict[str, Any]) -> float:
        return float(METRICS[self.metric][0](result))

    def met(self, figure: float) -> bool:
        """Whether ``figure`` of this metric reaches the target."""
        return figure >= self.value if METRICS[self.metric][1] else figure <= self.value

    def reached(self, result: dict[str, Any]) -> bool:
        return self.met(self.figure(result))

    def best(self, figures: Sequence[float]) -> float:
        """The best of ``figures`` of this metric."""
        return max(figures) if METRICS[self.metric][1] else min(figures)

    def __str__(self) -> str:
        return f"{self.metric}={self.value:g}"


def parse_target(text: str) -> Target:
    """``METRIC=VALUE``; ValueError naming what is wrong."""
    metric, eq, raw = (s.strip() for s in text.partition("="))
    if not eq:
        raise ValueError(f"--target {text!r} is not METRIC=VALUE with a metric among "
                         f"{', '.join(METRICS)}")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"--target {metric}: {raw!r:.40} is not a number") from None
    return Target(metric, value)


@dataclass
class Search:
    """One tier's search: every capacity run, in slots, with its figure, and the answer."""

    tier: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    answer: int | None = None

    def best(self, target: Target) -> float:
        return target.best([r["figure"] for r in self.rows])


Run = Callable[[int], dict[str, Any]]
"""``run(capacity in slots) -> the fleet replay's as_dict``."""
RunMany = Callable[[Sequence[int]], list[dict[str, Any]]]
"""``run_many(capacities) -> [run(c) for c in capacities]``, perhaps in worker processes."""


def search(tier: str, run: Run, grid: Sequence[int], target: Target,
           run_many: RunMany | None = None) -> Search:
    """The smallest capacity reaching ``target`` (module docstring). ``run_many`` runs the
    whole grid at once (in worker processes); what follows the first point that reaches
    the target is dropped, so the search reads exactly what running it in order would."""
    out = Search(tier)
    ahead = dict(zip(grid, run_many(grid), strict=True)) if run_many is not None else {}

    def reached(capacity: int) -> bool:
        result = ahead.pop(capacity, None) or run(capacity)
        out.rows.append({"tier": tier, "capacity": capacity, "figure": target.figure(result),
                         "token_hit_rate": result["token_hit_rate"],
                         "ttft_p90_s": result["ttft_s"]["p90"]})
        return target.reached(result)

    low = 0
    for capacity in grid:
        if reached(capacity):
            out.answer = capacity
            break
        low = capacity
    if out.answer is None:
        return out
    while out.answer - low > 1:  # reached at answer, not at low (or low == 0)
        mid = (low + out.answer) // 2
        if reached(mid):
            out.answer = mid
        else:
            low = mid
    out.rows.sort(key=lambda r: r["capacity"])
    return out


def plan(target: Target, tiers: Sequence[tuple[str, Run, Sequence[int]]],
         run_many: Callable[[str], RunMany] | None = None) -> list[Search]:
    """Search each ``(tier, run, grid)`` in order until one reaches the target;
    ``run_many(tier)``: that tier's grid at once (``search``)."""
    done: list[Search] = []
    for tier, run, grid in tiers:
        done.append(search(tier, run, grid, target,
                           run_many(tier) if run_many is not None else None))
        if done[-1].answer is not None:
            break
    return done


def plot(searches: Sequence[Search], target: Target, title: str, path: Path) -> None:
    """The figure against capacity for each tier searched, the target dashed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for s in searches:
        ax.plot([r["capacity"] for r in s.rows], [r["figure"] for r in s.rows], marker="o",
                ms=3, label=f"{s.tier} capacity")
        if s.answer is not None:
            ax.axvline(s.answer, color="grey", ls=":", lw=1, label=f"answer: {s.answer} slots")
    ax.axhline(target.value, color="black", ls="--", lw=1, label=f"target {target}")
    ax.set_xscale("log")
    ax.set_xlabel("capacity per engine (chunk slots; shared: in all)")
    ax.set_ylabel(target.metric)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
