"""A tiny decoder-only transformer in fp32, and its dense (unpaged) reference.

Pre-norm layers: ``x + attn(rmsnorm(x))`` then ``x + swiglu(rmsnorm(x))``; rotary
embeddings on queries and keys; grouped-query attention. How a layer gets the keys of
earlier positions is left to the caller through an ``AttentionFn``: the paged engine reads
them from its block tables, ``dense_logits`` recomputes every position from scratch. A
recurrent layer (``state`` group) mixes tokens by a gated delta net instead
(``kvtier.engine.recurrent``), from a state a ``StateIO`` hands it (the engine's paged
state blocks, or a zero state for a run from token 0).

Example::

    model = TinyModel(EngineConfig(groups=(GroupSpec("full"),)))
    tokens, logits = reference_generate(model, [1, 2, 3], max_tokens=4)
    len(tokens), logits.shape      # 4, (4, 256)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from kvtier.engine.attention import attend, attention_mask, rotary
from kvtier.engine.config import EngineConfig
from kvtier.engine.recurrent import (
    FreshState,
    RecurrentWeights,
    StateIO,
    init_recurrent,
    recurrent_mix,
)


class AttentionFn(Protocol):
    """Attention of one layer for a run of consecutive new tokens.

    ``q`` is ``[n, heads, head_dim]``, ``k`` and ``v`` are ``[n, kv_heads, head_dim]`` (after
    rotary), ``positions`` ``[n]``. Returns ``[n, heads * head_dim]``.
    """

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    recurrent: RecurrentWeights | None = None
    """The mixer of a recurrent layer, used instead of the attention weights above."""


@dataclass(frozen=True)
class ModelWeights:
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor
    lm_head: torch.Tensor


def _linear(gen: torch.Generator, fan_in: int, fan_out: int) -> torch.Tensor:
    return torch.randn(fan_in, fan_out, generator=gen) / fan_in**0.5


def _norm(gen: torch.Generator, size: int) -> torch.Tensor:
    return 1.0 + 0.1 * torch.randn(size, generator=gen)


def init_layer(gen: torch.Generator, config: EngineConfig) -> LayerWeights:
    """One decoder layer's weights, drawn from ``gen``."""
    h, q_width = config.hidden_size, config.num_heads * config.head_dim
    kv_width = config.num_kv_heads * config.head_dim
    return LayerWeights(
        attn_norm=_norm(gen, h), wq=_linear(gen, h, q_width), wk=_linear(gen, h, kv_width),
        wv=_linear(gen, h, kv_width), wo=_linear(gen, q_width, h), mlp_norm=_norm(gen, h),
        w_gate=_linear(gen, h, config.intermediate_size),
        w_up=_linear(gen, h, config.intermediate_size),
        w_down=_linear(gen, config.intermediate_size, h),
    )


def init_weights(config: EngineConfig) -> ModelWeights:
    """Random weights drawn from ``torch.Generator().manual_seed(config.seed)``."""
    gen = torch.Generator().manual_seed(config.seed)
    h = config.hidden_size
    layers = tuple(_with_mixer(init_layer(gen, config), config, i)
                   for i in range(config.num_layers))
    return ModelWeights(
        embed=torch.randn(config.vocab_size, h, generator=gen), layers=layers,
        final_norm=_norm(gen, h), lm_head=_linear(gen, h, config.vocab_size),
    )


def _with_mixer(layer: LayerWeights, config: EngineConfig, index: int) -> LayerWeights:
    """A recurrent layer gets its mixer from its own generator (seed ``config.seed + 2000 +
    index``), so that attention-only models draw exactly the weights they always did."""
    if not config.is_recurrent(index):
        return layer
    gen = torch.Generator().manual_seed(config.seed + 2000 + index)
    return replace(layer, recurrent=init_recurrent(gen, config.hidden_size, config.recurrent_shape))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


class TinyModel:
    """The reference transformer: weights plus a forward pass over new tokens."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.weights = init_weights(config)

    def forward(
        self, token_ids: Sequence[int], positions: torch.Tensor, attention: AttentionFn,
        states: StateIO | None = None,
    ) -> torch.Tensor:
        """Logits ``[n, vocab]`` of ``n`` new tokens at ``positions``."""
        return self.logits(self.hidden(token_ids, positions, attention, states))

    def hidden(
        self, token_ids: Sequence[int], positions: torch.Tensor, attention: AttentionFn,
        states: StateIO | None = None,
    ) -> torch.Tensor:
        """Final hidden states ``[n, hidden]`` (before the final norm): what drafts read.

        ``states`` feeds recurrent layers; None means a run from token 0 that keeps nothing.
        """
        x = self.embed(token_ids)
        for index, layer in enumerate(self.weights.layers):
            x = self.block(index, layer, x, positions, attention, states)
        return x

    def embed(self, token_ids: Sequence[int]) -> torch.Tensor:
        return self.weights.embed[torch.tensor(list(token_ids), dtype=torch.long)]

    def block(
        self, index: int, layer: LayerWeights, x: torch.Tensor, positions: torch.Tensor,
        attention: AttentionFn, states: StateIO | None = None,
    ) -> torch.Tensor:
        """One pre-norm decoder layer; ``index`` names its KV to ``attention`` (or its state
        to ``states``, for a recurrent layer)."""
        if layer.recurrent is None:
            x = x + self._attention(index, layer, x, positions, attention)
        else:
            x = x + self._recurrent(index, layer.recurrent, layer, x, positions, states)
        return x + self._mlp(layer, x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The shared head: final norm, then the vocabulary projection."""
        return rms_norm(hidden, self.weights.final_norm, self.config.rms_eps) @ self.weights.lm_head

    def _attention(
        self, index: int, layer: LayerWeights, x: torch.Tensor, positions: torch.Tensor,
        attention: AttentionFn,
    ) -> torch.Tensor:
        cfg = self.config
        h = rms_norm(x, layer.attn_norm, cfg.rms_eps)
        q = (h @ layer.wq).view(-1, cfg.num_heads, cfg.head_dim)
        k = (h @ layer.wk).view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = (h @ layer.wv).view(-1, cfg.num_kv_heads, cfg.head_dim)
        q = rotary(q, positions, cfg.rope_theta)
        k = rotary(k, positions, cfg.rope_theta)
        return attention(index, q, k, v, positions) @ layer.wo

    def _recurrent(
        self, index: int, mixer: RecurrentWeights, layer: LayerWeights, x: torch.Tensor,
        positions: torch.Tensor, states: StateIO | None,
    ) -> torch.Tensor:
        shape = self.config.recurrent_shape
        if states is None:
            assert int(positions[0]) == 0, "a recurrent layer past token 0 needs its state"
            states = FreshState(shape)
        h = rms_norm(x, layer.attn_norm, self.config.rms_eps)
        out, rows = recurrent_mix(mixer, shape, h, states.load(index))
        states.save(index, rows)
        return out

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, layer.mlp_norm, self.config.rms_eps)
        return (torch.nn.functional.silu(h @ layer.w_gate) * (h @ layer.w_up)) @ layer.w_down


def dense_logits(model: TinyModel, token_ids: Sequence[int]) -> torch.Tensor:
    """Logits ``[n, vocab]`` of every position, computed from scratch with no KV cache."""
    cfg = model.config
    positions = torch.arange(len(token_ids))

    def full_sequence(
        layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        assert cfg.layer_groups is not None
        spec = cfg.groups[cfg.layer_groups[layer]]
        return attend(q, k, v, attention_mask(spec, positions, positions))

    return model.forward(token_ids, positions, full_sequence)


def reference_generate(
    model: TinyModel, prompt: Sequence[int], max_tokens: int
) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding by full recomputation each step: the oracle for the paged engine.

    Returns the generated tokens and their logits ``[max_tokens, vocab]``.
    """
    tokens = list(prompt)
    logits = []
    for _ in range(max_tokens):
        last = dense_logits(model, tokens)[-1]
        logits.append(last)
        tokens.append(int(torch.argmax(last)))
    return tokens[len(prompt):], torch.stack(logits)
