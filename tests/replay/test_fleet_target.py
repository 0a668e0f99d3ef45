"""Planning to a target (``kvtier.replay.target``) and the fleet's CLI (``kvtier replay
--instances``): the search against brute force, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_cli_replay import run

from kvtier.layout import Group, Layout
from kvtier.replay import ReplayConfig, Workload
from kvtier.replay.fleet import FleetOptions, replay_fleet
from kvtier.replay.routers import parse_router
from kvtier.replay.synth import SynthConfig, generate
from kvtier.replay.target import Target, parse_target, plan, search

BLOCK = 64
LAYOUT = Layout((Group("full", BLOCK, bytes_per_token=16),))


def tiny() -> Workload:
    reqs = generate(SynthConfig(users=8, turns=3, system_prompts=2, system_tokens=2 * BLOCK,
                                user_tokens=2 * BLOCK, output_tokens=BLOCK, seed=4), BLOCK)
    return Workload(reqs, ReplayConfig(LAYOUT, block_tokens=BLOCK))


@pytest.mark.parametrize("instances", [1, 2])
@pytest.mark.parametrize("metric", ["token_hit", "ttft_p90"])
def test_search_finds_the_smallest_capacity_brute_force_finds(instances: int, metric: str
                                                              ) -> None:
    w = tiny()
    options = FleetOptions(instances, parse_router("round_robin"))
    results: dict[int, dict[str, Any]] = {}

    def run_at(capacity: int) -> dict[str, Any]:
        if capacity not in results:
            results[capacity] = replay_fleet(w, "lru", capacity, options=options).as_dict()
        return results[capacity]

    top = w.num_distinct_chunks()
    figure = Target(metric, 1.0).figure
    goal = (figure(run_at(1)) + figure(run_at(top))) / 2  # somewhere in between
    target = Target(metric, goal)
    brute = next(c for c in range(1, top + 1) if target.reached(run_at(c)))
    found = search("host", run_at, [1, 4, 16, 64, top], target)
    assert brute > 1 and found.answer == brute
    assert [r["capacity"] for r in found.rows] == sorted(r["capacity"] for r in found.rows)


def test_plan_goes_below_when_host_memory_cannot_reach() -> None:
    never = {"token_hit_rate": 0.1, "ttft_s": {"p90": 1.0}}
    enough = {"token_hit_rate": 0.5, "ttft_s": {"p90": 1.0}}
    searches = plan(parse_target("token_hit=0.4"),
                    [("host", lambda c: never, [1, 2]),
                     ("shared", lambda c: enough if c >= 5 else never, [1, 8])])
    assert [s.tier for s in searches] == ["host", "shared"]
    assert searches[0].answer is None and searches[1].answer == 5


def test_fleet_json_carries_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--limit", "150", "--model", "llama-3.1-8b", "--instances",
                         "3", "--router", "prefix:balance=0.5", "--shared", "8GiB", "--json")
    assert code == 0 and err == ""
    d = json.loads(out)
    assert d["instances"] == 3 and d["router"] == "prefix:balance=0.5"
    assert {"block_hit_rate", "token_hit_rate", "chunks_loaded_by_tier", "imbalance",
            "ttft_s", "ttft_cold_s"} <= d.keys()
    assert set(d["ttft_s"]) == {"p50", "p90", "p99"} and len(d["engines"]) == 3
    assert sum(e["requests"] for e in d["engines"]) == 150 and d["imbalance"]["requests"] >= 1
    code, out, _ = run(capsys, "--limit", "150", "--model", "llama-3.1-8b", "--instances", "3")
    assert code == 0 and "TTFT p50/p90/p99" in out and "loaded shared" in out


def test_target_prints_the_answer_and_writes_its_sweep(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "--limit", "120", "--model", "llama-3.1-8b", "--target",
                       "token_hit=0.01", "--out", str(tmp_path), "--json")
    d = json.loads(out)
    assert code == 0 and d["reached"] and d["tier"] == "host" and d["slots"] >= 1
    assert (tmp_path / "target.png").stat().st_size > 0
    assert json.loads((tmp_path / "target.json").read_text())["slots"] == d["slots"]


@pytest.mark.parametrize("argv", [
    ["--router", "nearest"], ["--router", "prefix:balance=-1"], ["--router", "session:x=1"],
    ["--target", "speed=1"], ["--target", "token_hit=nan"], ["--target", "token_hit"],
    ["--target", "ttft_p90=-2"], ["--instances", "0"], ["--instances", "2", "--policy", "belady"],
    ["--instances", "2", "--policy", "lru,s3fifo"], ["--instances", "2", "--sweep"],
    ["--target", "token_hit=0.999", "--json"],
])
def test_bad_fleet_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    code, out, err = run(capsys, "--limit", "40", "--model", "llama-3.1-8b", "--out",
                         str(tmp_path), *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    if "token_hit=0.999" in argv:
        assert "unreachable" in err and "best reached" in err


@pytest.mark.parametrize(("argv", "admit"), [
    ((), 2), (("--instances", "1"), 2), (("--instances", "2"), 1),
    (("--instances", "2", "--admit", "3"), 3),
])
def test_default_admission_is_per_engine_count(
        capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], admit: int) -> None:
    """One engine admits at the second offer; a fleet, N times the cache, at the first
    (docs/replay.md, "Defaults"); an explicit --admit always wins."""
    code, out, _ = run(capsys, "--synthetic", "users=20,seed=1", "--host-chunks", "64",
                       *argv, "--json")
    assert code == 0 and json.loads(out)["admit_after"] == admit
