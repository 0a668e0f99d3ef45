"""Attention math shared by the paged engine and the dense reference.

The mask is the definition of each attention kind; both paths call it, and the paged path
additionally only *has* the keys its allocator retained. Comparing the two therefore tests
the allocator and the block tables, not the mask.

* full: query ``i`` sees keys ``j <= i``;
* sliding window ``W``: ``i - W + 1 <= j <= i``;
* chunked local ``C``: ``j <= i`` and ``j // C == i // C``.
"""

from __future__ import annotations

import torch

from kvtier.engine.config import GroupSpec


def attention_mask(spec: GroupSpec, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Boolean ``[num_q, num_k]``: True where query position may attend to key position.

    Example: sliding window 3, query 5, keys 2..5: ``[False, True, True, True]``.
    """
    q = q_pos[:, None]
    k = k_pos[None, :]
    allowed = k <= q
    if spec.kind == "sliding_window":
        assert spec.window is not None
        allowed &= k > q - spec.window
    elif spec.kind == "chunked_local":
        assert spec.chunk is not None
        allowed &= (k // spec.chunk) == (q // spec.chunk)
    return allowed


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x`` (``[tokens, heads, head_dim]``) by its positions (rotate-half form)."""
    half = x.shape[-1] // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos = torch.cos(angles)[:, None, :]
    sin = torch.sin(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Grouped-query attention of ``q`` ``[nq, H, D]`` over ``k, v`` ``[nk, KVH, D]``.

    Returns ``[nq, H * D]``. Every query must see at least one key (its own position).
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    repeat = num_heads // k.shape[1]
    k = k.repeat_interleave(repeat, dim=1)
    v = v.repeat_interleave(repeat, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / head_dim**0.5
    scores = scores.masked_fill(~mask[None, :, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("hqk,khd->qhd", probs, v)
    return out.reshape(q.shape[0], num_heads * head_dim)
