"""Draft modules: multi-module MTP and EAGLE, each one attention layer with its own KV.

Module ``m`` (``m = 1 .. K``; EAGLE is ``K = 1``) at position ``i`` reads the hidden state
``h[m-1][i]`` (``h[0]`` is the target's final hidden state) and the embedding of token
``i + m``; it writes its KV at position ``i`` (so that KV depends on tokens ``[0, i + m]``:
lookahead ``m``), outputs ``h[m][i]`` and, through the target's shared head, predicts token
``i + m + 1``.

Example, MTP with ``K = 2`` after the target computed positions ``0..63`` of a 65-token
prompt and produced token 65: module 1 can run positions ``0..63`` (it reads tokens up to
64), module 2 positions ``0..63`` too (it reads token 65). The *frontier* of module ``m``
is the first position it has not computed with true inputs: ``min(horizon, known - m)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from kvtier.engine.model import AttentionFn, LayerWeights, TinyModel, rms_norm


@dataclass(frozen=True)
class DraftWeights:
    """One module: norms of its two inputs, their projection, one decoder layer."""

    hidden_norm: torch.Tensor
    embed_norm: torch.Tensor
    proj: torch.Tensor
    layer: LayerWeights


def init_drafts(target: TinyModel) -> tuple[DraftWeights, ...]:
    """Draft modules "distilled" from the target without training, so acceptance is high.

    Module ``m`` copies the target's first attention layer and feeds it mostly the embedding
    of token ``i + m``: rotary attention is relative, so at position ``i`` it reads the
    sequence shifted by ``m`` much as that target layer does at ``i + m``. A small random
    share of the hidden state ``h[m - 1][i]`` (seed ``config.seed + 1000 + m``) keeps the
    hidden states, and so the stored draft tail, on the path: a wrong one changes drafts.
    """
    config = target.config
    h = config.hidden_size
    layer = _first_attention_layer(target)
    out = []
    for m in range(1, config.num_draft_modules + 1):
        gen = torch.Generator().manual_seed(config.seed + 1000 + m)
        mix = 0.2 * torch.randn(h, h, generator=gen) / h**0.5
        out.append(DraftWeights(hidden_norm=torch.ones(h), embed_norm=target.weights.embed.std()
                                * torch.ones(h), proj=torch.cat((mix, torch.eye(h))),
                                layer=layer))
    return tuple(out)


def _first_attention_layer(target: TinyModel) -> LayerWeights:
    """The target's first attention layer (a draft module is one); in a model of recurrent
    layers only, the first layer's attention weights, drawn but unused by the target."""
    layers = target.weights.layers
    attention = (w for w in layers if w.recurrent is None)
    return next(attention, replace(layers[0], recurrent=None))


class DraftModel:
    """The draft modules of one engine, sharing the target's embedding and head."""

    def __init__(self, target: TinyModel) -> None:
        self.target = target
        self.config = target.config
        self.weights = init_drafts(target)

    @property
    def num_modules(self) -> int:
        return len(self.weights)

    def layer_index(self, module: int) -> int:
        """The layer id module ``m`` uses for its KV: after the target's layers."""
        return self.config.num_layers + module - 1

    def forward(
        self, module: int, hidden_in: torch.Tensor, token_ids: Sequence[int],
        positions: torch.Tensor, attention: AttentionFn,
    ) -> torch.Tensor:
        """Outputs ``h[module]`` ``[n, hidden]`` at ``positions``.

        ``hidden_in`` is ``h[module - 1]`` there; ``token_ids`` are the tokens at
        ``positions + module`` (true ones, or drafts while proposing).
        """
        w, eps = self.weights[module - 1], self.config.rms_eps
        x = torch.cat((rms_norm(hidden_in, w.hidden_norm, eps),
                       rms_norm(self.target.embed(token_ids), w.embed_norm, eps)), dim=-1)
        x = x @ w.proj
        return self.target.block(self.layer_index(module), w.layer, x, positions, attention)

    def predict(self, hidden: torch.Tensor) -> list[int]:
        """Greedy tokens from module outputs, through the target's head."""
        return [int(t) for t in torch.argmax(self.target.logits(hidden), dim=-1)]
