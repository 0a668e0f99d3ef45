"""`kvtier demo` through its entry point: JSON report, table, bad input, torch missing."""

from __future__ import annotations

import json
import sys

import pytest

from kvtier.cli import main

SMALL = ["--turns", "3", "--user-tokens", "20", "--tokens", "3"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_demo_json_restores_earlier_turns_and_matches_cold(capsys):
    pytest.importorskip("torch")
    code, out, _ = run(capsys, "demo", *SMALL, "--json")
    assert code == 0
    report = json.loads(out)
    turns = report["turns"]
    assert [t["prompt_tokens"] for t in turns] == [20, 43, 66]
    # hybrid layout, hits every 16 tokens. Turn 1 stored 22 tokens' worth (its last answer
    # token has no KV): boundary 16. Turn 2 stored up to 45: boundary 32.
    assert [t["hit_tokens"] for t in turns] == [0, 16, 32]
    assert all(t["identical"] is True for t in turns)
    assert all(t["ttft_cold_s"] > 0 and t["ttft_warm_s"] > 0 for t in turns)
    assert turns[0]["bytes_loaded"] == 0 and turns[1]["bytes_loaded"] > 0


@pytest.mark.parametrize("layout", ["full", "mtp", "local", "mixed-blocks"])
def test_demo_table_for_each_layout(capsys, layout: str):
    pytest.importorskip("torch")
    code, out, _ = run(capsys, "demo", *SMALL, "--layout", layout, "--seed", "3")
    assert code == 0
    assert f"layout {layout}" in out and "warm TTFT" in out
    assert out.count(" yes") == 3 and " NO" not in out


def exit_status(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Exit status and stderr, whether argparse exits or the command returns."""
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--turns", "0"], "--turns: must be >= 1"),
        (["--layout", "nope"], "invalid choice: 'nope'"),
        (["--host-bytes", "12"], "smaller than one slot"),
        (["--turns", "64", "--user-tokens", "4096"], "keep turns x (user tokens + tokens)"),
    ],
)
def test_demo_bad_input_is_one_line_and_exit_2(capsys, argv: list[str], message: str):
    pytest.importorskip("torch")
    code, err = exit_status(capsys, "demo", *argv)
    assert code == 2
    assert message in err and err.count("\n") == 1


def test_demo_without_torch_says_which_extra_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    code, out, err = run(capsys, "demo", "--turns", "1")
    assert code == 2 and out == ""
    assert "needs torch" in err and "kvtier[torch]" in err and err.count("\n") == 1


@pytest.mark.parametrize(("spec", "extra"), [("mtp", []), ("eagle", ["--spec-tokens", "3"]),
                                             ("mtp", ["--force-rejections"])])
def test_demo_reports_acceptance_equal_cold_and_warm(capsys, spec: str, extra: list[str]):
    pytest.importorskip("torch")
    code = main(["demo", "--json", "--turns", "2", "--user-tokens", "40", "--tokens", "12",
                 "--layout", "mtp", "--speculative", spec, *extra])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["speculative"] == spec
    last = report["turns"][-1]
    assert last["hit_tokens"] > 0 and last["identical"]
    assert last["warm_drafted"] > 0
    for key in ("drafted", "accepted", "rejected"):
        assert last[f"warm_{key}"] == last[f"cold_{key}"]
    assert last["warm_drafted"] == last["warm_accepted"] + last["warm_rejected"]
    if "--force-rejections" in extra:
        assert last["warm_accepted"] == 0
