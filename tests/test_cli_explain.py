"""`kvtier explain` through its entry point: tables, JSON and bad input."""

from __future__ import annotations

import json

import pytest

from kvtier.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_explain_json_matches_design_example(capsys, tmp_path):
    path = tmp_path / "l.toml"
    path.write_text("[[groups]]\nkind='full'\ntokens_per_block=16\nbytes_per_token=2\n"
                    "[[groups]]\nkind='sliding_window'\ntokens_per_block=4\nwindow=8\n"
                    "extra_retained=3\nbytes_per_token=2\n")
    code, out, _ = run(capsys, "explain", "--layout", str(path), "--tokens", "33", "--hit", "32",
                       "--json")
    assert code == 0
    report = json.loads(out)
    assert report["hit_granularity"] == 16 and report["boundaries"] == [16, 32]
    full, swa = report["groups"]
    assert full["stored_chunks"] == [0, 1] and full["required_chunks"] == [0, 1]
    assert swa["stored_chunks"] == [1, 2, 3, 5, 6, 7] and swa["required_chunks"] == [5, 6, 7]
    assert swa["stored_bytes"] == 6 * 4 * 2 and swa["dense_bytes"] == 8 * 4 * 2


def test_explain_table_for_a_preset(capsys):
    code, out, _ = run(capsys, "explain", "--model", "gpt-oss-120b", "--tokens", "1000")
    assert code == 0
    assert "sliding_window" in out and "admissible boundaries: 256, 512, 768" in out


def test_explain_bytes_null_without_sizes(capsys, tmp_path):
    path = tmp_path / "l.json"
    path.write_text(json.dumps({"groups": [{"kind": "full", "tokens_per_block": 4}]}))
    _, out, _ = run(capsys, "explain", "--layout", str(path), "--tokens", "9", "--json")
    assert json.loads(out)["groups"][0]["stored_bytes"] is None


@pytest.mark.parametrize(("argv", "message"), [
    (["explain", "--model", "nope"], "unknown model 'nope'"),
    (["explain", "--tokens", "-3"], "must be >= 1"),
    (["explain", "--tokens", "many"], "is not an integer"),
    (["explain", "--hit", "100"], "not a multiple of the hit granularity 256"),
    (["explain", "--tokens", "300", "--hit", "512"], "past the last boundary"),
    (["explain", "--layout", "/nonexistent.toml"], "cannot read layout file"),
    (["explain", "--model", "gpt-oss-120b", "--layout", "x.toml"], "not allowed with"),
    (["explain", "--mtp", "-1"], "argument --mtp: must be >= 0, got -1"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_help_for_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--help"])
    assert exc.value.code == 0
    assert "--tokens" in capsys.readouterr().out


def test_explain_shows_the_whole_prompt_hit_of_a_repeat(capsys, tmp_path):
    """A prompt ending on a boundary: its repeat restores all but the last token; one
    token longer, the boundary itself; with a state group, the boundary before."""
    path = tmp_path / "l.toml"
    path.write_text("[[groups]]\nkind='full'\ntokens_per_block=16\nblocks_per_chunk=4\n"
                    "[[groups]]\nkind='chunked_local'\ntokens_per_block=16\n"
                    "blocks_per_chunk=4\nchunk=256\n")
    code, out, _ = run(capsys, "explain", "--layout", str(path), "--tokens", "256", "--json")
    report = json.loads(out)
    assert code == 0 and report["repeat"] == {"hit": 255, "whole_prompt": True}
    assert [g["repeat_chunks"] for g in report["groups"]] == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert report["groups"][1]["stored_chunks"] == [0, 1, 2, 3]
    _, out, _ = run(capsys, "explain", "--layout", str(path), "--tokens", "256")
    assert "restores 255 tokens (its whole-prompt hit at boundary 256" in out
    _, out, _ = run(capsys, "explain", "--layout", str(path), "--tokens", "257", "--json")
    assert json.loads(out)["repeat"] == {"hit": 256, "whole_prompt": False}
    path.write_text("[[groups]]\nkind='full'\ntokens_per_block=16\nblocks_per_chunk=4\n"
                    "[[groups]]\nkind='state'\ntokens_per_block=16\nblocks_per_chunk=4\n")
    _, out, _ = run(capsys, "explain", "--layout", str(path), "--tokens", "256", "--json")
    assert json.loads(out)["repeat"] == {"hit": 192, "whole_prompt": False}
