"""The recurrent hybrids' presets hold what their published configs imply.

Each expectation is computed here from the model's own config.json numbers (copied below,
trimmed), by the state shapes vLLM allocates for them, not taken from the code under test.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvtier.presets import PRESETS, preset

# Qwen/Qwen3-Next-80B-A3B-Instruct, config.json (trimmed); bf16, no SSM dtype override.
QWEN3_NEXT_80B = {
    "num_hidden_layers": 48, "full_attention_interval": 4, "num_key_value_heads": 2,
    "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "torch_dtype": "bfloat16",
}

# nvidia/Nemotron-H-8B-Base-8K, config.json (trimmed); vLLM keeps its SSM state in fp32.
NEMOTRON_H_8B = {
    "num_hidden_layers": 52,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_key_value_heads": 8, "attention_head_dim": 128, "mamba_num_heads": 128,
    "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
    "torch_dtype": "bfloat16",
}
BF16, FP32 = 2, 4


def test_qwen3_next_groups_match_its_config() -> None:
    c = QWEN3_NEXT_80B
    full = c["num_hidden_layers"] // c["full_attention_interval"]
    linear = c["num_hidden_layers"] - full
    conv_channels = (2 * c["linear_num_key_heads"] * c["linear_key_head_dim"]
                     + c["linear_num_value_heads"] * c["linear_value_head_dim"])
    conv = (c["linear_conv_kernel_dim"] - 1) * conv_channels * BF16
    recurrent = (c["linear_num_value_heads"] * c["linear_value_head_dim"]
                 * c["linear_key_head_dim"] * BF16)
    attention, state = preset("qwen3-next-80b").groups
    assert (attention.kind, attention.num_layers) == ("full", full) == ("full", 12)
    assert attention.bytes_per_token == 2 * full * c["num_key_value_heads"] * c["head_dim"] * BF16
    assert (state.kind, state.num_layers) == ("state", linear)
    assert state.bytes_per_chunk == linear * (conv + recurrent)
    assert state.bytes_per_chunk == 36 * (32 * 128 * 128 * 2 + 3 * 8192 * 2)  # by hand


def test_nemotron_h_groups_match_its_config() -> None:
    c = NEMOTRON_H_8B
    pattern = c["hybrid_override_pattern"]
    assert len(pattern) == c["num_hidden_layers"]
    mamba, attn = pattern.count("M"), pattern.count("*")
    heads, head_dim, n = c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"]
    conv = (c["conv_kernel"] - 1) * (heads * head_dim + 2 * c["n_groups"] * n) * BF16
    ssm = heads * head_dim * n * FP32
    attention, state = preset("nemotron-h-8b").groups
    assert (attention.kind, attention.num_layers) == ("full", attn) == ("full", 4)
    assert attention.bytes_per_token == (
        2 * attn * c["num_key_value_heads"] * c["attention_head_dim"] * BF16)
    assert (state.kind, state.num_layers) == ("state", mamba) == ("state", 24)
    assert state.bytes_per_chunk == mamba * (conv + ssm)
    assert state.bytes_per_chunk == 24 * (128 * 64 * 128 * 4 + 3 * 10240 * 2)  # by hand


@pytest.mark.parametrize("name", ["qwen3-next-80b", "nemotron-h-8b"])
def test_one_state_per_chunk_whatever_the_chunk_size(name: str) -> None:
    # A state chunk holds the state after its last token: its bytes do not grow with tokens.
    attention, state = preset(name).groups
    assert state.bytes_per_chunk == state.bytes_per_block
    assert attention.bytes_per_chunk == attention.bytes_per_token * attention.tokens_per_chunk


@pytest.mark.parametrize("name", ["qwen3-next-80b", "nemotron-h-8b"])
def test_replay_plans_capacity_for_the_hybrid_preset(name: str) -> None:
    assert name in PRESETS
    out = subprocess.run(
        [sys.executable, "-m", "kvtier", "replay", "--model", name, "--limit", "60", "--json"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["model"] == preset(name).model
    groups = {g["kind"]: g for g in report["policies"]["lru"]["groups"]}
    layout = {g.kind: g for g in preset(name).groups}
    for kind in ("full", "state"):  # each group's chunks are counted at its own size
        chunk_bytes = layout[kind].bytes_per_chunk
        assert groups[kind]["offered_chunks"] > 0
        assert groups[kind]["offered_bytes"] == groups[kind]["offered_chunks"] * chunk_bytes
        assert groups[kind]["loaded_bytes"] == groups[kind]["loaded_chunks"] * chunk_bytes
