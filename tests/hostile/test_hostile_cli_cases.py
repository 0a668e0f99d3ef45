"""Every CLI input of issue 20 that ended in a traceback, a hang or silent nonsense: each now
ends in one line and exit 2 (or, where it is valid, succeeds with bounded memory)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_cli import assert_clean, assert_refused, request_line, run

REPLAY = ["replay", "--model", "llama-3.1-8b", "--limit", "20"]


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("argv", "message"), [
    (["--policy", ","], "--policy ',' names no policy; give one or more of lru"),
    (["--sweep", "1"], "argument --sweep: must be >= 2, got 1"),
    (["--sweep", "100000"], "argument --sweep: must be <= 64"),
    (["--synthetic", "think_time_s=inf"], "synthetic: think_time_s must be a finite number"),
    (["--synthetic", "arrival_rate_per_s=nan"], "synthetic: arrival_rate_per_s must be a finite"),
    (["--synthetic", "users=1000000000"], "hash ids; at most 2,000,000"),
    # streamed: --limit 20 replays (and checks) only the first 20 requests, so the first
    # one must be late; decode_tokens_per_s=1e-300 delays only later rounds
    (["--synthetic", "arrival_rate_per_s=1e-300"], "the last request would arrive after"),
    (["--timing", "host_gb_per_s=nan"], "timing: host_gb_per_s must be a finite number"),
    (["--timing", "prefill_tokens_per_s=inf"], "must be a finite number"),
    (["--timing", "load_latency_ms=1e300"], "timing: load_latency_ms must be >= 0"),
    (["--host", "1" + "0" * 30], "argument --host: '1000000000000000000000000000000' is not a "
                                  "size from 1 byte to 8 EiB"),
    (["--host", "9" * 5000], "argument --host:"),
    (["--host-chunks", "1" + "0" * 30], "argument --host-chunks: must be <= 9223372036854775807"),
    (["--bytes", "--slot-bytes", "0"], "argument --slot-bytes: '0' is not a size"),
    (["--bytes", "--slot-bytes", "1TiB", "--host-chunks", "1024"],
     "the host slab (1024 slots of --slot-bytes 1.0 TiB) of 1048576.0 GiB is more than this "
     "machine's memory"),
    (["--mtp", "1000000"], "argument --mtp: must be <= 64"),
    (["--mtp-modules", "1000000"], "argument --mtp-modules: must be <= 16"),
    (["--block-tokens", "1" + "0" * 20], "argument --block-tokens: must be <= 33554432"),
])
def test_replay_flags_refused_in_one_line(argv: list[str], message: str) -> None:
    assert_refused(run([*REPLAY, *argv]), message)


def test_save_trace_to_a_directory_or_a_missing_one(tmp_path: Path) -> None:
    assert_refused(run([*REPLAY, "--save-trace", str(tmp_path)]),
                   f"--save-trace {tmp_path}: cannot write a trace file there (Is a directory)")
    missing = tmp_path / "missing" / "t.jsonl"
    assert_refused(run([*REPLAY, "--save-trace", str(missing)]),
                   "cannot write a trace file there (No such file or directory)")


def test_huge_host_chunks_cost_no_memory_up_front() -> None:
    """10**12 slots: the allocator is lazy, so a metadata replay runs (it needed 39 TB)."""
    argv = [*REPLAY, "--host-chunks", "1000000000000", "--json"]
    ending = run(argv)
    assert_clean(ending, argv)
    assert ending.code == 0
    assert json.loads(ending.out)["policies"]["lru"]["slots"] == {"host": 10**12}


def test_explain_huge_prompt_refused_at_once() -> None:
    """``--tokens 10**15`` took 72 s and then failed; now what it lists is capped first."""
    assert_refused(run(["explain", "--tokens", "1" + "0" * 15]),
                   "--tokens 1000000000000000 is 3906250000000 chunks of 256 tokens; the report"
                   " lists each, so at most 1000000: give --tokens <= 256000000")


def test_demo_host_bytes_beyond_memory() -> None:
    pytest.importorskip("torch")
    assert_refused(run(["demo", "--host-bytes", "100TiB"]), "--host-bytes 100.0 TiB: host slab")


@pytest.mark.parametrize(("argv", "message"), [
    (["--seed", "-1"], "argument --seed: must be >= 0"),
    (["--threads", "1" + "0" * 20], "argument --threads: must be <= 1024"),
    (["--spec-tokens", "1" + "0" * 20], "argument --spec-tokens: must be <= 64"),
    (["--host-bytes", "0"], "argument --host-bytes: '0' is not a size"),
])
def test_demo_flags_refused_in_one_line(argv: list[str], message: str) -> None:
    assert_refused(run(["demo", *argv]), message)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_layout_nested_too_deeply(tmp_path: Path, suffix: str) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    text = '{"groups": ' + deep + "}" if suffix == ".json" else f"groups = {deep}\n"
    path = write(tmp_path / f"deep{suffix}", text)
    assert_refused(run(["explain", "--layout", path]), f"layout file {path} is nested too deeply")


@pytest.mark.parametrize(("text", "message"), [
    ("x" * (2**20 + 1), "is over 1048576 bytes"),
    ("groups = " + "1" * 5000, "is not valid TOML"),
])
def test_layout_file_too_big_or_with_a_huge_number(tmp_path: Path, text: str, message: str) -> None:
    assert_refused(run(["explain", "--layout", write(tmp_path / "l.toml", text)]), message)


def test_layout_file_that_never_ends() -> None:
    assert_refused(run(["explain", "--layout", "/dev/zero"]), "is over 1048576 bytes")


@pytest.mark.parametrize(("line", "message"), [
    ("[" * 100_000 + "]" * 100_000 + "\n", "line 1: JSON nested too deeply"),
    (request_line(timestamp=float("inf")), "timestamp must be a number of milliseconds from 0 "
                                           "to 2**53, got inf"),
    (request_line(timestamp=float("nan")), "got nan"),
    (request_line(timestamp=10**400), "timestamp must be a number of milliseconds"),
    ('{"timestamp": 1e400, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n',
     "got inf"),
    (request_line(output_length=10**30), "output_length must be an integer >= 0 and <= 33554432"),
    (request_line(input_length=512 * 10**6, hash_ids=list(range(10**6))),
     "input_length must be an integer >= 1 and <= 33554432"),
    (request_line(input_length=10, hash_ids=[1] * (2**20 + 1)),
     "1048577 hash_ids; a request has at most 1048576"),
    ('{"timestamp": ' + "1" * 5000 + "}\n", "line 1: not a usable JSON value"),
])
def test_hostile_trace_lines(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path / "t.jsonl", line)
    assert_refused(run(["replay", path, "--model", "llama-3.1-8b"]), message)


def test_trace_that_never_ends() -> None:
    """``/dev/zero`` is one endless line: refused at ``MAX_LINE_CHARS``, not read forever."""
    assert_refused(run(["replay", "/dev/zero", "--model", "llama-3.1-8b"]),
                   "/dev/zero line 1: longer than 33554432 characters")


def _kvtier(*argv: str, **kw: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, "-m", "kvtier", *argv], env=env,
                            stderr=subprocess.PIPE, **kw)  # type: ignore[call-overload]


def test_ctrl_c_exits_130_with_one_line(tmp_path: Path) -> None:
    """The replay blocks reading a FIFO; SIGINT then arrives while it waits for the trace."""
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    proc = _kvtier("replay", str(fifo), "--model", "llama-3.1-8b", stdout=subprocess.PIPE)
    with open(fifo, "wb"):  # returns once the replay has opened the trace: it is waiting
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, b"", b"kvtier: interrupted\n")


def test_closed_pipe_exits_quietly() -> None:
    """``kvtier explain --json | head -c 0``: the reader is gone before the first byte."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = _kvtier("explain", "--json", stdout=write_end)
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (141, b"")


def test_version() -> None:
    ending = run(["--version"])
    assert ending.code == 0 and ending.out.startswith("kvtier ")
