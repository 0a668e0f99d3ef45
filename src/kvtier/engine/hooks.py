"""The offloader hooks: the whole interface between the reference engine and kvtier.

The engine calls an ``Offloader`` at fixed points of a request's life and never looks at
tiers, keys or chunks. Each step is a separate call because each happens at a different
time and may be asynchronous underneath:

* ``lookup`` decides the hit *before* any block exists, so the engine can allocate exactly
  the hit's retained blocks;
* ``on_allocated`` hands over those blocks so loads can start, while ``wait_loaded`` is the
  later point where the engine needs them filled (loads overlap other requests' compute);
* ``on_computed`` reports the horizon while the blocks that just left the retained span are
  still held, so chunks that only a smaller boundary needs can still be stored;
* ``before_free`` is the fence: a block goes back to the pool (and may be overwritten) only
  after the offloader says no pending store reads it.

Call order for one request (``hit`` > 0 only when ``lookup`` found one)::

    register_kv_caches(kv_caches)                 once, when the engine is built
    hit = lookup(request)                         at admission, no blocks held yet
    on_allocated(request, hit, block_tables)      always, even for hit == 0
    ok = wait_loaded(request)                     only if hit > 0, before its first compute
      [ok is False: before_free(request, loaded blocks); recompute from token 0]
    repeat each step:
      on_computed(request, n, block_tables)       after computing up to n; nothing freed yet
      before_free(request, block_ids)             if blocks left retained_blocks(group, n)
    on_finished(request)                          after its last on_computed
    before_free(request, all remaining block_ids) then the blocks return to the pool

For ``hit`` = b, the engine allocates, for positions ``[0, b)`` of each group, exactly the
blocks ``kvtier.coverage.restored_blocks(group, b)`` (a contiguous range of logical
blocks; ``retained_blocks(group, b)`` for every group but a draft group with a recomputed
tail, whose engine computes on from ``coverage.restore_point``); all others are ``None``
in ``block_tables``. ``b`` must be a multiple of every
group's ``tokens_per_block`` and at most ``num_prompt_tokens - 1``; the engine raises
``ValueError`` otherwise.
"""

from __future__ import annotations

from typing import Protocol

import torch

from kvtier.engine.request import BlockIds, BlockTables, Request


class Offloader(Protocol):
    """What the engine calls. Every method runs on the engine's thread, inside ``step``."""

    def register_kv_caches(self, kv_caches: list[list[torch.Tensor]]) -> None:
        """The engine's KV tensors, group outermost, one per layer of the group.

        Each is ``[num_blocks, 2, tokens_per_block, kv_heads, head_dim]`` fp32, or for a
        recurrent layer one state row per block ``[num_blocks, state_numel]``; physical
        block ``i`` of a group is row ``i`` of each of its tensors. The tensors live as long
        as the engine (``reset_device_cache`` refills them in place).
        """
        ...

    def lookup(self, request: Request) -> int:
        """Leading prompt tokens that can be restored (0 for a miss)."""
        ...

    def on_allocated(self, request: Request, hit_tokens: int, block_tables: BlockTables) -> None:
        """Blocks for the hit are allocated; start filling the non-None ones."""
        ...

    def wait_loaded(self, request: Request) -> bool:
        """Block until the hit's loads end. False: they failed, recompute from token 0."""
        ...

    def on_computed(
        self, request: Request, num_computed_tokens: int, block_tables: BlockTables
    ) -> None:
        """Positions ``[0, num_computed_tokens)`` have KV; store what became storable.

        ``block_tables`` still holds every block held during the step, including those about
        to leave the retained span. Stores may run on after this returns; ``before_free``
        is where the engine waits for them.
        """
        ...

    def before_free(self, request: Request, block_ids: BlockIds) -> None:
        """Return only when no pending store or load still touches these physical blocks."""
        ...

    def on_finished(self, request: Request) -> None:
        """The request produced its last token; its blocks are freed right after."""
        ...


class NullOffloader:
    """An offloader that never hits and stores nothing: the engine alone."""

    def register_kv_caches(self, kv_caches: list[list[torch.Tensor]]) -> None:
        pass

    def lookup(self, request: Request) -> int:
        return 0

    def on_allocated(self, request: Request, hit_tokens: int, block_tables: BlockTables) -> None:
        pass

    def wait_loaded(self, request: Request) -> bool:
        return True

    def on_computed(
        self, request: Request, num_computed_tokens: int, block_tables: BlockTables
    ) -> None:
        pass

    def before_free(self, request: Request, block_ids: BlockIds) -> None:
        pass

    def on_finished(self, request: Request) -> None:
        pass
