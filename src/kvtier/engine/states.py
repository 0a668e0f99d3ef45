"""Recurrent states in paged blocks, align-mode style: one state per block boundary.

A ``state`` group with ``T`` tokens per block keeps, for a request whose horizon is ``n``:

* in logical block ``j`` for every block boundary ``b = (j + 1) * T <= n`` the engine passed
  in the step that reached ``n``: the state after token ``b - 1`` (what kvtier stores with
  the chunk ending at ``b``);
* in logical block ``(n - 1) // T``: the state after token ``n - 1``, the one the next token
  starts from. When ``n`` is a block boundary this is that boundary's state.

The allocator keeps only block ``(n - 1) // T`` (``coverage.retained_blocks`` of a state
group), after ``on_computed`` has seen the others, so each boundary's state lives exactly as
long as kvtier needs to store it. A hit at ``b`` restores block ``(b - 1) // T`` and the
engine continues from it, as from its own.

Example: ``T = 4``, a step computing tokens 5..13 from horizon 5: it reads block 1 (the
state after token 4), writes the states after tokens 7 and 11 into blocks 1 and 2, and the
state after token 13 into block 3; then blocks 1 and 2 are freed.

States of a verify run past the accepted horizon (rejected drafts) are never written:
``commit`` takes the horizon the step ends at.
"""

from __future__ import annotations

import torch

from kvtier.engine.blocks import PagedKVCache
from kvtier.engine.request import Request


class PagedStates:
    """The ``StateIO`` of one request's run of tokens from ``start``, over its state blocks."""

    def __init__(self, cache: PagedKVCache, request: Request, start: int) -> None:
        self._cache, self._request, self._start = cache, request, start
        self._rows: dict[int, torch.Tensor] = {}

    def load(self, layer: int) -> torch.Tensor:
        """The state after token ``start - 1``, from its block; zeros at token 0."""
        if self._start == 0:
            return torch.zeros(self._cache.config.recurrent_shape.state_numel)
        group = self._cache.group_of(layer)
        tpb = self._cache.config.groups[group].tokens_per_block
        table = self._request.block_tables[group]
        return self._cache.read_row(layer, table, (self._start - 1) // tpb)

    def save(self, layer: int, rows: torch.Tensor) -> None:
        """Keep the run's states until ``commit`` knows how many tokens the step keeps."""
        self._rows[layer] = rows

    def commit(self, horizon: int) -> None:
        """Write the states at each block boundary in ``(start, horizon]`` and the state
        after token ``horizon - 1`` into their blocks."""
        for layer, rows in self._rows.items():
            group = self._cache.group_of(layer)
            tpb = self._cache.config.groups[group].tokens_per_block
            table = self._request.block_tables[group]
            last = horizon - 1
            ends = [*range(-(-(self._start + 1) // tpb) * tpb - 1, last, tpb), last]
            for token in ends:
                self._cache.write_row(layer, table, token // tpb, rows[token - self._start])
        self._rows.clear()
