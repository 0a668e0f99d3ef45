"""The replay streams its trace (issue 20, item 10): same figures as before, less held.

``data/streaming_golden.json`` holds ``kvtier replay --json`` figures computed by the
replay before it streamed (every request and its references held in lists), for the
bundled trace and synthetic traces, sequential, concurrent, with a disk tier, ``--bytes``
and ``--sweep``. Online policies with ghost filters hash keys with Python's ``hash``, so
the figures were taken, and are compared, with ``PYTHONHASHSEED=0``. ``s3fifo``'s and
``pfreq``'s figures were taken again when the replay's keys came to hash block ids rather
than tokens (issue 32, ``ReplayChain``): equal keys still mean equal prefixes, so every
other policy's figures did not move, but those two pick filter and sketch cells by the
key bytes, and other bytes collide elsewhere (1 to 10 chunks in these cases).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from kvtier.layout import Group, Layout
from kvtier.replay import ReplayConfig, Workload, replay
from kvtier.replay.synth import SynthConfig, iter_generate, synthetic_source
from kvtier.replay.trace import TraceError, parse_lines

GOLDEN = Path(__file__).parent / "data" / "streaming_golden.json"
_IGNORED = ("wall_s", "seconds", "files", "read_seconds", "write_seconds", "disk_dir", "tiers")
_RUN_ALL = """
import io, json, sys, contextlib
from kvtier.cli.main import main
out = {}
for name, argv in json.load(sys.stdin).items():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["replay", *argv, "--json"]) == 0, name
    out[name] = json.loads(buf.getvalue())
print(json.dumps(out))
"""


def _differences(golden: object, now: object, path: str = "") -> list[str]:
    """Where ``now`` departs from ``golden`` (fields added since are not compared)."""
    if isinstance(golden, dict):
        assert isinstance(now, dict), path
        return [d for k, v in golden.items() if k not in _IGNORED
                for d in (_differences(v, now[k], f"{path}/{k}") if k in now
                          else [f"{path}/{k} missing"])]
    if isinstance(golden, list):
        assert isinstance(now, list) and len(now) == len(golden), path
        return [d for i, (a, b) in enumerate(zip(golden, now, strict=True))
                for d in _differences(a, b, f"{path}[{i}]")]
    return [] if golden == now else [f"{path}: {golden!r} before, {now!r} now"]


def test_cli_figures_equal_the_replay_that_held_the_trace(tmp_path: Path) -> None:
    cases = json.loads(GOLDEN.read_text())
    argv = {name: [a.replace("/tmp/h20/sweep-out", str(tmp_path / "sweep")) for a in c["argv"]]
            for name, c in cases.items()}
    done = subprocess.run([sys.executable, "-c", _RUN_ALL], input=json.dumps(argv), text=True,
                          capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"},
                          check=True, timeout=600)
    now = json.loads(done.stdout.splitlines()[-1])
    for name, case in cases.items():
        assert _differences(case["result"], now[name]) == [], name


SYNTH_SHA256 = {  # sha256 of the JSON of generate(), before it streamed: first 16 digits
    "": "19d523f80149d2cb",
    "users=40,turns=4,seed=3": "05689ba835620f0c",
    "users=300,turns=6,seed=9,think_time_s=0": "1eff296133988c8c",
    "users=100,seed=1,arrival_rate_per_s=100,think_time_s=1": "19c75e00660a8ddf",
    "users=50,turns=3,system_prompts=1,seed=2,arrival_rate_per_s=1e6": "cb2840dc5dc85eb1",
}


@pytest.mark.parametrize("spec", sorted(SYNTH_SHA256))
def test_streamed_synthetic_trace_is_the_sorted_one(spec: str) -> None:
    reqs = list(iter_generate(SynthConfig.parse(spec)))
    digest = hashlib.sha256(json.dumps([r.as_json() for r in reqs]).encode()).hexdigest()
    assert digest[:16] == SYNTH_SHA256[spec]
    assert digest[:16] != SYNTH_SHA256[""] or spec == ""  # the digests tell traces apart


def _peak(fn: object) -> int:
    tracemalloc.start()
    try:
        fn()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_streaming_holds_a_fraction_of_the_trace() -> None:
    """A streamed replay's peak is a fraction of holding the trace and its references
    (the replay before streaming held both, then replayed)."""
    config = ReplayConfig(Layout((Group("full", 512),)))
    source = synthetic_source(SynthConfig(users=600, turns=5, seed=4))
    streamed = _peak(lambda: replay(Workload(source, config), "lru", 64))
    held = _peak(lambda: list(Workload(source, config).items()))
    listed = replay(Workload(list(source()), config), "lru", 64).as_dict()
    streamed_stats = replay(Workload(source, config), "lru", 64).as_dict()
    listed["wall_s"] = streamed_stats["wall_s"] = 0.0
    assert listed == streamed_stats and listed["requests"] > 1500
    assert streamed < held / 4, (streamed, held)


def test_one_line_of_a_million_hash_ids_is_bounded() -> None:
    """At 512-token blocks such a line is refused (prompt too long); at 32-token blocks it
    is the largest request allowed, and parsing it takes tens of MB, not GBs."""
    n = 10**6
    ids = list(range(2**40, 2**40 + n))
    line = json.dumps({"timestamp": 0, "input_length": 512 * n, "output_length": 1,
                       "hash_ids": ids})
    with pytest.raises(TraceError, match="input_length must be"):
        parse_lines([line])
    line = json.dumps({"timestamp": 0, "input_length": 32 * n, "output_length": 1,
                       "hash_ids": ids})
    del ids
    peak = _peak(lambda: parse_lines([line], block_tokens=32))
    assert peak < 128 * 2**20, peak
