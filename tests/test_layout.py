"""Layout validation, layout files and presets."""

from __future__ import annotations

import json
import os

import pytest

from kvtier.layout import Group, Layout
from kvtier.layoutfile import load_layout
from kvtier.presets import PRESETS, preset, with_eagle, with_mtp


def test_default_granularity_is_lcm_of_chunk_sizes():
    layout = Layout((Group("full", 16, 4), Group("sliding_window", 4, 6, window=100)))
    assert layout.hit_granularity == 192
    with pytest.raises(ValueError, match="multiple of every group's tokens_per_chunk"):
        Layout(layout.groups, hit_granularity=100)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "dense", "tokens_per_block": 16}, "kind must be one of"),
    ({"kind": "full", "tokens_per_block": 0}, "tokens_per_block must be >= 1"),
    ({"kind": "full", "tokens_per_block": 16, "blocks_per_chunk": 1.5}, "must be an integer"),
    ({"kind": "sliding_window", "tokens_per_block": 16}, "window must be an integer"),
    ({"kind": "full", "tokens_per_block": 16, "window": 8}, "window is only for"),
    ({"kind": "full", "tokens_per_block": 16, "extra_retained": 2}, "extra_retained is only"),
    ({"kind": "chunked_local", "tokens_per_block": 16}, "chunk must be an integer"),
    ({"kind": "state", "tokens_per_block": 16, "lookahead": 1}, "cannot have a lookahead"),
    ({"kind": "state", "tokens_per_block": 16, "bytes_per_token": 4}, "bytes_per_state"),
    ({"kind": "full", "tokens_per_block": 16, "lookahead": -1}, "lookahead must be >= 0"),
])
def test_bad_groups_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Group(**kwargs)


def test_empty_layout_is_rejected():
    with pytest.raises(ValueError, match="at least one group"):
        Layout(())


TOML = """
hit_granularity = 64
[[groups]]
kind = "full"
tokens_per_block = 16
bytes_per_token = 1024
[[groups]]
kind = "sliding_window"
tokens_per_block = 16
window = 32
extra_retained = 3
name = "swa"
"""


def test_layout_from_toml_and_json(tmp_path):
    toml = tmp_path / "l.toml"
    toml.write_text(TOML)
    layout = load_layout(toml)
    assert layout.hit_granularity == 64
    assert layout.groups[1] == Group("sliding_window", 16, window=32, extra_retained=3, name="swa")
    js = tmp_path / "l.json"
    js.write_text(json.dumps({"groups": [{"kind": "full", "tokens_per_block": 8}]}))
    assert load_layout(js).groups == (Group("full", 8),)


@pytest.mark.parametrize(("text", "message"), [
    ("groups = 3", "'groups' must be a non-empty list"),
    ("[[groups]]\nkind = 'full'\ntokens_per_block = 16\nwindw = 3", "unknown keys \\['windw'\\]"),
    ("colour = 1\n[[groups]]\nkind = 'full'\ntokens_per_block = 16", "unknown keys \\['colour'\\]"),
    ("[[groups]]\nkind = 'full'", "needs at least 'kind' and 'tokens_per_block'"),
    ("[[groups]]\nkind = 'full'\ntokens_per_block = -4", "groups\\[0\\]"),
    ("[[groups", "not valid TOML"),
])
def test_bad_layout_files(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_layout(path)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read layout file"):
        load_layout(tmp_path / "nope.toml")


def test_presets_have_published_geometry():
    assert preset("llama-3.1-8b").groups[0].bytes_per_token == 131072  # 128 KiB per token
    oss = preset("gpt-oss-120b")
    assert [g.kind for g in oss.groups] == ["full", "sliding_window"]
    assert oss.groups[1].window == 128
    assert preset("gemma-3-27b").groups[1].window == 1024
    assert preset("llama-4-scout").groups[1].chunk == 8192
    assert preset("qwen3-next-80b").groups[1].kind == "state"
    assert preset("deepseek-v3").groups[0].bytes_per_token == 61 * 576 * 2
    for name in PRESETS:
        assert preset(name).max_bytes_per_chunk
    with pytest.raises(ValueError, match=r"known models: llama-3\.1-8b"):
        preset("llama-9")


def test_speculative_options():
    mtp = with_mtp(preset("gpt-oss-120b"), num_speculative_tokens=4, num_modules=2)
    assert mtp.groups[1].extra_retained == 3
    assert [g.lookahead for g in mtp.groups] == [0, 0, 1, 2]
    assert mtp.max_lookahead == 2
    eagle = with_eagle(preset("llama-3.1-8b"))
    assert eagle.groups[-1].lookahead == 1
    assert eagle.groups[-1].bytes_per_token == 4096
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        with_mtp(preset("gpt-oss-120b"), 0)


def test_a_layout_unpickled_in_another_process_finds_its_equal_in_a_dict():
    """Layout caches its hash; a pickle must not carry it to a process whose str hashes
    differ (a replay's workers), or an equal layout there would miss every cache."""
    import pickle
    import subprocess
    import sys

    layout = Layout((Group("full", 16, num_layers=2),
                     Group("sliding_window", 16, window=64, num_layers=2)), model="m")
    hash(layout)  # cached here, under this process's seed
    child = (
        "import pickle, sys\n"
        "from kvtier.layout import Group, Layout\n"
        "loaded = pickle.loads(sys.stdin.buffer.read())\n"
        "fresh = Layout((Group('full', 16, num_layers=2),"
        " Group('sliding_window', 16, window=64, num_layers=2)), model='m')\n"
        "print({fresh: 'found'}.get(loaded, 'missed'))\n"
    )
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", child], input=pickle.dumps(layout),
                             capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed},
                             check=True)
        assert out.stdout.decode().strip() == "found"
