"""Model presets with their published KV-cache geometry, and speculative-decoding options.

Bytes per token are for all layers of a group together: ``2 (K and V) * layers * kv_heads *
head_dim * dtype_bytes`` (for MLA: ``layers * (kv_lora_rank + rope_dim) * dtype_bytes``).
Figures come from each model's published ``config.json``. Chunks default to 256 tokens
(16-token blocks, 16 blocks per chunk), the size most offloaders store.

A preset is a registry entry, not an ``if`` chain: add a model by adding one function to
``PRESETS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from kvtier.layout import Group, Layout

TOKENS_PER_BLOCK = 16
BLOCKS_PER_CHUNK = 16


def _kv(kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """KV bytes of one token in one layer."""
    return 2 * kv_heads * head_dim * dtype_bytes


def _full(name: str, layers: int, bytes_per_layer: int) -> Group:
    return Group("full", TOKENS_PER_BLOCK, BLOCKS_PER_CHUNK,
                 bytes_per_token=layers * bytes_per_layer, num_layers=layers, name=name)


def _swa(name: str, window: int, layers: int, bytes_per_layer: int) -> Group:
    return Group("sliding_window", TOKENS_PER_BLOCK, BLOCKS_PER_CHUNK, window=window,
                 bytes_per_token=layers * bytes_per_layer, num_layers=layers, name=name)


def llama_3_1_8b() -> Layout:
    """32 layers, 8 KV heads of 128, bf16: 128 KiB per token, all full attention."""
    return Layout((_full("full", 32, _kv(8, 128)),), model="meta-llama/Llama-3.1-8B")


def gpt_oss_120b() -> Layout:
    """36 layers alternating sliding window 128 and full, 8 KV heads of 64, bf16."""
    return Layout(
        (_full("full", 18, _kv(8, 64)), _swa("sliding", 128, 18, _kv(8, 64))),
        model="openai/gpt-oss-120b",
    )


def gemma_3_27b() -> Layout:
    """62 layers, 5 local (window 1024) to 1 global, 16 KV heads of 128, bf16."""
    return Layout(
        (_full("global", 10, _kv(16, 128)), _swa("local", 1024, 52, _kv(16, 128))),
        model="google/gemma-3-27b-it",
    )


def llama_4_scout() -> Layout:
    """48 layers, every fourth global, the rest chunked local attention of 8192 tokens."""
    local = Group("chunked_local", TOKENS_PER_BLOCK, BLOCKS_PER_CHUNK, chunk=8192,
                  bytes_per_token=36 * _kv(8, 128), num_layers=36, name="chunked")
    return Layout((_full("global", 12, _kv(8, 128)), local),
                  model="meta-llama/Llama-4-Scout-17B-16E")


def gated_delta_net_state_bytes(
    k_heads: int, v_heads: int, k_dim: int, v_dim: int, conv_kernel: int, dtype_bytes: int = 2
) -> int:
    """Bytes of one Gated DeltaNet layer's state: the recurrent state ``v_heads x v_dim x
    k_dim`` plus the convolution state ``(conv_kernel - 1) x conv_dim``, where the causal
    convolution runs over q, k and v together: ``conv_dim = 2 * k_heads * k_dim + v_heads *
    v_dim`` (vLLM's ``MambaStateShapeCalculator.gated_delta_net_state_shape``).

    Example: Qwen3-Next (16 key heads, 32 value heads of 128, kernel 4, bf16):
    ``32 * 128 * 128 * 2 + 3 * 8192 * 2 = 1,097,728``.
    """
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return (v_heads * v_dim * k_dim + (conv_kernel - 1) * conv_dim) * dtype_bytes


def mamba2_state_bytes(
    heads: int, head_dim: int, state_size: int, n_groups: int, conv_kernel: int,
    conv_bytes: int = 2, ssm_bytes: int = 4,
) -> int:
    """Bytes of one Mamba2 layer's state: the SSM state ``heads x head_dim x state_size``
    plus the convolution state ``(conv_kernel - 1) x conv_dim``, where the convolution runs
    over x, B and C: ``conv_dim = heads * head_dim + 2 * n_groups * state_size`` (vLLM's
    ``MambaStateShapeCalculator.mamba2_state_shape``). vLLM keeps NemotronH's SSM state in
    fp32 by default (``NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE``) and the
    convolution state in the model's dtype.

    Example: Nemotron-H 8B (128 heads of 64, state 128, 8 groups, kernel 4):
    ``128 * 64 * 128 * 4 + 3 * 10240 * 2 = 4,255,744``.
    """
    conv_dim = heads * head_dim + 2 * n_groups * state_size
    return heads * head_dim * state_size * ssm_bytes + (conv_kernel - 1) * conv_dim * conv_bytes


def _state(name: str, layers: int, bytes_per_layer: int) -> Group:
    return Group("state", TOKENS_PER_BLOCK, BLOCKS_PER_CHUNK,
                 bytes_per_state=layers * bytes_per_layer, num_layers=layers, name=name)


def qwen3_next_80b() -> Layout:
    """48 layers: 12 gated attention (2 KV heads of 256) and 36 Gated DeltaNet layers.

    From Qwen/Qwen3-Next-80B-A3B-Instruct's config.json: ``num_hidden_layers`` 48,
    ``full_attention_interval`` 4 (12 full, 36 linear), ``num_key_value_heads`` 2,
    ``head_dim`` 256, ``linear_num_key_heads`` 16, ``linear_num_value_heads`` 32,
    ``linear_key_head_dim`` 128, ``linear_value_head_dim`` 128, ``linear_conv_kernel_dim`` 4,
    bf16. One DeltaNet layer's state is 1,097,728 bytes (``gated_delta_net_state_bytes``),
    36 of them per stored state: 37.7 MiB, against 6 MiB for a 256-token attention chunk.
    """
    return Layout((_full("attention", 12, _kv(2, 256)),
                   _state("deltanet", 36, gated_delta_net_state_bytes(16, 32, 128, 128, 4))),
                  model="Qwen/Qwen3-Next-80B-A3B-Instruct")


def nemotron_h_8b() -> Layout:
    """52 layers: 4 attention (8 KV heads of 128), 24 Mamba2 and 24 MLP-only layers.

    From nvidia/Nemotron-H-8B-Base-8K's config.json: ``hybrid_override_pattern``
    ``M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-`` (24 ``M``, 4 ``*``),
    ``num_key_value_heads`` 8, ``attention_head_dim`` 128, ``mamba_num_heads`` 128,
    ``mamba_head_dim`` 64, ``ssm_state_size`` 128, ``n_groups`` 8, ``conv_kernel`` 4, bf16
    (SSM state fp32 in vLLM). One Mamba2 layer's state is 4,255,744 bytes
    (``mamba2_state_bytes``), 24 of them per stored state: 97.4 MiB, against 4 MiB for a
    256-token attention chunk. MLP-only layers hold no cache.
    """
    return Layout((_full("attention", 4, _kv(8, 128)),
                   _state("mamba2", 24, mamba2_state_bytes(128, 64, 128, 8, 4))),
                  model="nvidia/Nemotron-H-8B-Base-8K")


def deepseek_v3() -> Layout:
    """61 MLA layers: one latent of 512 + 64 rope dims per token and layer, bf16."""
    return Layout((_full("mla", 61, (512 + 64) * 2),), model="deepseek-ai/DeepSeek-V3")


PRESETS: dict[str, Callable[[], Layout]] = {
    "llama-3.1-8b": llama_3_1_8b,
    "gpt-oss-120b": gpt_oss_120b,
    "gemma-3-27b": gemma_3_27b,
    "llama-4-scout": llama_4_scout,
    "qwen3-next-80b": qwen3_next_80b,
    "nemotron-h-8b": nemotron_h_8b,
    "deepseek-v3": deepseek_v3,
}


def preset(name: str) -> Layout:
    """The layout of a registered model, e.g. ``preset("gpt-oss-120b")``."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(PRESETS)}") from None


def with_mtp(layout: Layout, num_speculative_tokens: int, num_modules: int = 0) -> Layout:
    """Multi-module MTP with ``k`` speculative tokens: sliding-window groups keep ``E = k-1``.

    Each of ``num_modules`` draft modules adds a full-attention group whose KV at position
    ``i`` depends on token ``i + m`` (module ``m`` = 1, 2, ...), that is lookahead ``m``.
    Draft groups copy the first group's block geometry and one layer's bytes per token.
    """
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    if num_modules < 0:
        raise ValueError(f"num_modules must be >= 0, got {num_modules}")
    groups = [
        replace(g, extra_retained=num_speculative_tokens - 1) if g.kind == "sliding_window" else g
        for g in layout.groups
    ]
    groups += [_draft_group(layout, f"mtp{m}", m) for m in range(1, num_modules + 1)]
    return layout.with_groups(tuple(groups))


def with_eagle(layout: Layout) -> Layout:
    """EAGLE: one draft layer whose KV at ``i`` depends on token ``i + 1`` (lookahead 1)."""
    return layout.with_groups((*layout.groups, _draft_group(layout, "eagle", 1)))


def _draft_group(layout: Layout, name: str, lookahead: int) -> Group:
    base = layout.groups[0]
    per_layer = None if base.bytes_per_token is None else base.bytes_per_token // base.num_layers
    return Group("full", base.tokens_per_block, base.blocks_per_chunk, lookahead=lookahead,
                 bytes_per_token=per_layer, name=name)
