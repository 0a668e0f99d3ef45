"""Recurrent-state (Mamba, gated delta net) groups inside vLLM: which block holds a state,
and which tensors hold its bytes. Plain data and duck-typed tensors (no vLLM import).

Which block. In ``mamba_cache_mode="align"`` vLLM keeps the state after token ``b - 1`` in
a block of its own for each block boundary ``b``, but a state group's block table is not
append-only (vLLM nulls interior states and relocates blocks in place), so a block's place
in the table does not say which boundary it holds. vLLM names the block instead: per step,
``SchedulerOutput.kv_connector_block_state.boundary_state_offloads`` lists ``(group,
block_id, boundary_tokens)`` for every state the step's forward leaves at a boundary.
``state_blocks`` turns those into the one table kvtier's planner reads for stores: the
block of the state at boundary ``b`` at position ``b / tokens_per_block - 1``, where the
coverage contract keeps the state of the chunk ending at ``b`` (``coverage.store_blocks``).
A boundary between two block ends (vLLM's partial-tail states) has no chunk: ignored.

A hit is restored into the block vLLM allocates for it: for a hit at ``b`` vLLM's align
mode allocates one block, at position ``b / tokens_per_block - 1`` of the table it hands
``update_state_after_alloc``, the last, from which the request's forward reads its state.

Which bytes. vLLM hands a state layer's cache as its state tensors (conv state, then the
SSM or delta-net state), each ``[num_blocks, ...]`` in pages padded to the attention page
size; ``layer_tensors`` lists them, and the data plane copies each block's own bytes
(``kvtier.transfer.views``), never the padding (``layout.state_bytes``).

>>> from kvtier.layout import Group, Layout
>>> layout = Layout((Group("state", 1152, bytes_per_state=64), Group("full", 1152,
...                  bytes_per_token=8)))
>>> state_blocks(layout, [(0, 17, 2304), (0, 9, 1152), (0, 5, 2600), (1, 3, 1152)])
((0, 1, 17), (0, 0, 9))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvtier.layout import Layout

StateBlock = tuple[int, int, int]
"""``(group, position, block_id)``: vLLM's block ``block_id`` holds the state of ``group``
that kvtier's block table keeps at ``position``."""


def state_blocks(layout: Layout, offloads: Iterable[Sequence[int]]) -> tuple[StateBlock, ...]:
    """The table entries vLLM's boundary-state hand-offs give (see the module docstring):
    one per hand-off of a state group at a multiple of its block size."""
    out = []
    for group, block_id, boundary in offloads:
        g = layout.groups[group] if 0 <= group < len(layout.groups) else None
        if g is None or g.kind != "state" or boundary <= 0 or boundary % g.tokens_per_block:
            continue
        out.append((int(group), boundary // g.tokens_per_block - 1, int(block_id)))
    return tuple(out)


def layer_tensors(cache: Any) -> list[Any]:
    """The tensors of one layer's cache as vLLM registers it: an attention layer's one KV
    tensor, or a state layer's state tensors in vLLM's order (conv state first)."""
    if isinstance(cache, (list, tuple)):
        return list(cache)
    return [cache]
