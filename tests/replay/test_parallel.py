"""``--jobs``: independent replays in worker processes give the figures one at a time gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_cli_replay import SMALL, run

from kvtier.layout import Group, Layout
from kvtier.replay import ReplayConfig, Workload, replay
from kvtier.replay.parallel import Task, check_jobs, run_all
from kvtier.replay.synth import SynthConfig, synthetic_source
from kvtier.replay.workload import count_requests


def figures(obj: Any) -> Any:
    """``obj`` without the wall-clock seconds (the only thing that may differ)."""
    if isinstance(obj, dict):
        return {k: figures(v) for k, v in obj.items() if k != "wall_s"}
    if isinstance(obj, list):
        return [figures(v) for v in obj]
    return obj


def replay_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run(capsys, *SMALL, "--json", *argv)
    assert code == 0, err
    return figures(json.loads(out))


# s3fifo's ghost filter and pfreq's counts hash keys with Python's hash(), whose seed each
# process draws at start (PYTHONHASHSEED): their figures may differ by a few chunks between
# any two processes, one run of kvtier replay and the next as much as two workers
DETERMINISTIC = "lru,arc,belady,infinite"


def test_jobs_1_and_2_print_the_same_figures(capsys: pytest.CaptureFixture[str]) -> None:
    one = replay_json(capsys, "--policy", DETERMINISTIC, "--host-chunks", "800", "--jobs", "1")
    two = replay_json(capsys, "--policy", DETERMINISTIC, "--host-chunks", "800", "--jobs", "2")
    assert one == two
    assert list(two["policies"]) == DETERMINISTIC.split(",")
    # negative control: the comparison sees a change of capacity
    assert replay_json(capsys, "--policy", DETERMINISTIC, "--host-chunks", "400",
                       "--jobs", "2") != one


def test_sweep_rows_do_not_depend_on_jobs(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    rows = []
    for jobs in ("1", "2"):
        obj = replay_json(capsys, "--sweep", "3", "--policy", "lru,belady,infinite",
                          "--out", str(tmp_path / jobs), "--jobs", jobs)
        rows.append(obj["rows"])
    assert rows[0] == rows[1] and len(rows[0]) == 3 + 3 + 1


def test_target_search_does_not_depend_on_jobs(capsys: pytest.CaptureFixture[str],
                                               tmp_path: Path) -> None:
    found = [replay_json(capsys, "--target", "token_hit=0.03", "--out", str(tmp_path / j),
                         "--jobs", j) for j in ("1", "2")]
    assert found[0] == found[1] and found[0]["reached"]
    assert len(found[0]["sweep"]) >= 2  # the grid up to the answer, then the bisection


def test_run_all_keeps_order_and_counts_every_request() -> None:
    source = synthetic_source(SynthConfig(users=20, turns=3), limit=40)
    assert count_requests(source) == 40
    workload = Workload(source, ReplayConfig(Layout((Group("full", 512),))))
    tasks = [Task(replay, (workload, policy, slots)) for policy, slots in
             (("lru", 5), ("arc", 50), ("lru", 50))]
    counted: list[int] = []
    stats = run_all(tasks, jobs=2, advance=counted.append)
    assert [(s.policy, s.slots["host"]) for s in stats] == [("lru", 5), ("arc", 50), ("lru", 50)]
    assert sum(counted) == 3 * 40
    alone = [t.run(None) for t in tasks]
    assert [s.block_hits for s in stats] == [s.block_hits for s in alone]
    assert stats[0].block_hits < stats[2].block_hits  # the capacities differ: so do the figures


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True, "2"])
def test_bad_jobs_are_refused(jobs: object) -> None:
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        check_jobs(jobs)  # type: ignore[arg-type]


def test_cli_refuses_zero_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *SMALL, "--jobs", "0")
    assert code == 2 and "--jobs" in err
