"""``kvtier replay``: JSON, tables, the sweep's files, and one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.cli.main import main

SMALL = ["--limit", "200", "--model", "llama-3.1-8b"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["replay", *argv])
    except SystemExit as e:  # argparse's own errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_one_policy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *SMALL, "--host", "64GiB", "--json")
    assert code == 0 and err == ""
    obj = json.loads(out)
    assert obj["requests"] == 200 and obj["policy"] == "lru"
    assert 0 < obj["token_hit_rate"] <= obj["block_hit_rate"] + 0.01 < 1
    assert set(obj["policies"]) == {"lru"}
    assert obj["policies"]["lru"]["slots"] == {"host": 64 * 2**30 // (128 * 1024 * 256)}


def test_json_every_policy_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *SMALL, "--policy", "all", "--host-chunks", "800", "--json")
    obj = json.loads(out)
    assert code == 0 and list(obj["policies"])[-2:] == ["belady", "infinite"]
    for entry in obj["policies"].values():
        assert {"requests", "block_hit_rate", "token_hit_rate"} <= entry.keys()
    code, out, _ = run(capsys, *SMALL, "--policy", "lru,belady", "--disk", "1TiB")
    assert code == 0 and "belady" in out and "loaded disk" in out and "dense" in out


def test_synthetic_and_saved_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    saved = tmp_path / "synth.jsonl"
    code, out, _ = run(capsys, "--synthetic", "users=20,turns=3", "--save-trace", str(saved),
                       "--host-chunks", "500", "--json")
    assert code == 0 and json.loads(out)["requests"] == len(saved.read_text().splitlines())
    code, out, _ = run(capsys, str(saved), "--host-chunks", "500", "--json", "--concurrent")
    assert code == 0 and json.loads(out)["mode"] == "concurrent"


def test_sweep_writes_csv_json_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, *SMALL, "--sweep", "3", "--policy", "lru,belady,infinite",
                       "--out", str(tmp_path))
    assert code == 0 and "wrote" in out
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    assert len(rows) == 3 + 3 + 1
    assert (tmp_path / "sweep.csv").read_text().startswith("policy,host_slots")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("argv", "message"), [
    (["--host", "lots"], "is not a size"),
    (["--policy", "mru"], "unknown policy 'mru'"),
    (["--timing", "warp=9"], "timing: 'warp=9' is not key=value"),
    (["--synthetic", "users=-1"], "synthetic: users must be an integer >= 1"),
    (["--host", "1KiB"], "holds no chunk"),
    (["--limit", "0"], "must be >= 1"),
    (["--admit", "0"], "--admit: "),
    (["--admit", "65"], "--admit: "),
    (["--admit", "two"], "--admit: "),
    (["--admit-window", "0"], "--admit-window: "),
])
def test_bad_arguments_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "--model", "llama-3.1-8b", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_malformed_trace_file_exit_2_names_the_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 1, "input_length": 10, "output_length": 1}\n')
    code, out, err = run(capsys, str(bad), "--model", "llama-3.1-8b")
    assert code == 2 and out == ""
    assert err.strip() == (f"kvtier replay: error: {bad} line 2: missing field(s) ['hash_ids']; "
                           "a request needs ['timestamp', 'input_length', 'output_length', "
                           "'hash_ids']")


def test_layout_without_sizes_needs_chunk_counts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    layout = tmp_path / "l.json"
    layout.write_text(json.dumps({"groups": [{"kind": "full", "tokens_per_block": 512}]}))
    code, _, err = run(capsys, "--layout", str(layout), "--limit", "50")
    assert code == 2 and "give --host-chunks N instead" in err
    code, out, _ = run(capsys, "--layout", str(layout), "--limit", "50", "--host-chunks", "99",
                       "--json")
    assert code == 0 and json.loads(out)["policies"]["lru"]["slots"] == {"host": 99}
