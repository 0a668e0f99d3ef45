"""The reference engine's recurrent layer: a gated delta net (Qwen3-Next's linear attention).

A ``state`` group's layers carry no per-token KV. Each keeps, per sequence, a state of fixed
size that summarises every token so far, as Gated DeltaNet and Mamba2 layers do:

* a *conv state*: the last ``conv_kernel - 1`` inputs of a causal depthwise convolution over
  the q, k and v channels (``[conv_kernel - 1, 3 * heads * head_dim]``);
* a *recurrent state* ``S`` per head (``[heads, head_dim, head_dim]``, keys by values),
  updated by the gated delta rule at each token ``t``::

      S = alpha_t * S                                  # decay (gate), alpha in (0, 1)
      S = S + beta_t * k_t (v_t - S^T k_t)^T           # delta rule, beta in (0, 1)
      o_t = S^T q_t                                    # read, then output gate and projection

  with ``q`` and ``k`` L2-normalised, so ``S`` stays bounded in fp32.

The state after token ``t`` is flattened into one fp32 row (conv state, then ``S``): that row
is what the paged cache keeps per block and what kvtier stores per chunk. Computing tokens
``[s, e)`` needs only the row after token ``s - 1`` (zeros for ``s = 0``), and gives the row
after every token of the run, so the engine can keep the one at each block boundary.

Example: 2 heads of 8, kernel 4: a row is ``3 * 48 + 2 * 8 * 8 = 272`` floats, 1,088 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

#: Shifts the decay gate towards 1 (``alpha`` about 0.95 on average at 3.0), as trained
#: models' gates sit: a state remembers many tokens, so a wrong restored state shows.
DECAY_BIAS = 3.0

#: Scales the mixer's output up to the size of an attention layer's: with random weights a
#: delta-rule read is a few percent of the residual stream, and the state would hardly matter.
OUTPUT_GAIN = 4.0


@dataclass(frozen=True)
class RecurrentShape:
    """The state geometry of one recurrent layer."""

    heads: int
    """Heads of the delta rule (query, key and value heads alike)."""
    head_dim: int
    """Width of one head's keys and values."""
    conv_kernel: int
    """Taps of the causal convolution; the conv state keeps ``conv_kernel - 1`` inputs."""

    @property
    def channels(self) -> int:
        """Channels of the convolution: q, k and v of every head."""
        return 3 * self.heads * self.head_dim

    @property
    def conv_numel(self) -> int:
        return (self.conv_kernel - 1) * self.channels

    @property
    def state_numel(self) -> int:
        """Floats of one flattened state row: conv state, then the recurrent state."""
        return self.conv_numel + self.heads * self.head_dim * self.head_dim


@dataclass(frozen=True)
class RecurrentWeights:
    """One recurrent layer's mixer (its MLP is the decoder layer's own)."""

    w_qkv: torch.Tensor
    """``[hidden, channels]``: the convolution's inputs."""
    conv: torch.Tensor
    """``[conv_kernel, channels]``: depthwise taps, oldest input first."""
    w_alpha: torch.Tensor
    """``[hidden, heads]``: the decay gate."""
    w_beta: torch.Tensor
    """``[hidden, heads]``: the delta rule's write strength."""
    w_gate: torch.Tensor
    """``[hidden, heads * head_dim]``: the output gate."""
    wo: torch.Tensor
    """``[heads * head_dim, hidden]``: the output projection."""


def init_recurrent(gen: torch.Generator, hidden: int, shape: RecurrentShape) -> RecurrentWeights:
    """Random weights for one recurrent layer, drawn from ``gen``."""
    width = shape.heads * shape.head_dim

    def linear(fan_in: int, fan_out: int) -> torch.Tensor:
        return torch.randn(fan_in, fan_out, generator=gen) / fan_in**0.5

    return RecurrentWeights(
        w_qkv=linear(hidden, shape.channels),
        conv=torch.randn(shape.conv_kernel, shape.channels, generator=gen) / shape.conv_kernel,
        w_alpha=linear(hidden, shape.heads), w_beta=linear(hidden, shape.heads),
        w_gate=linear(hidden, width), wo=OUTPUT_GAIN * linear(width, hidden),
    )


class StateIO(Protocol):
    """Where a recurrent layer's state comes from and where its new states go.

    ``load(layer)`` is the state row before the run's first token; ``save(layer, rows)``
    receives ``[n, state_numel]``: row ``i`` is the state after the run's token ``i``.
    """

    def load(self, layer: int) -> torch.Tensor: ...

    def save(self, layer: int, rows: torch.Tensor) -> None: ...


class FreshState:
    """A run from token 0 with nothing kept: zero initial state, new states dropped."""

    def __init__(self, shape: RecurrentShape) -> None:
        self._numel = shape.state_numel

    def load(self, layer: int) -> torch.Tensor:
        return torch.zeros(self._numel)

    def save(self, layer: int, rows: torch.Tensor) -> None:
        pass


def recurrent_mix(
    w: RecurrentWeights, shape: RecurrentShape, h: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mixer over a run of ``n`` tokens (``h``: ``[n, hidden]``, normalised input) from
    the state row ``state``; returns its output ``[n, hidden]`` and the state rows after each
    token ``[n, state_numel]``.

    Tokens are taken one at a time, so a run split anywhere gives the same states as one run.
    """
    heads, d, taps = shape.heads, shape.head_dim, shape.conv_kernel
    conv_state = state[: shape.conv_numel].view(taps - 1, shape.channels)
    s = state[shape.conv_numel :].view(heads, d, d).clone()
    inputs = torch.cat((conv_state, h @ w.w_qkv))  # [taps - 1 + n, channels]
    alpha = torch.exp(-torch.nn.functional.softplus(h @ w.w_alpha - DECAY_BIAS))  # [n, heads]
    beta = torch.sigmoid(h @ w.w_beta)
    outs, rows = [], []
    for t in range(h.shape[0]):
        window = inputs[t : t + taps]  # the token's input and the taps - 1 before it
        qkv = torch.nn.functional.silu((window * w.conv).sum(dim=0)).view(3, heads, d)
        q = torch.nn.functional.normalize(qkv[0], dim=-1)
        k = torch.nn.functional.normalize(qkv[1], dim=-1)
        s = alpha[t, :, None, None] * s
        old = torch.einsum("hkv,hk->hv", s, k)
        s = s + beta[t, :, None, None] * k[:, :, None] * (qkv[2] - old)[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q).reshape(heads * d))
        rows.append(torch.cat((inputs[t + 1 : t + taps].reshape(-1), s.reshape(-1))))
    out = torch.stack(outs) * torch.nn.functional.silu(h @ w.w_gate)
    return out @ w.wo, torch.stack(rows)
