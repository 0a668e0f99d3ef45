"""Test doubles for the engine's offloader hooks, and small shared configs.

``SnapshotCache`` is a stand-in for kvtier: it stores the KV bytes of every block a request
computed, keyed by (prompt, group, logical block), and restores them into a later request
with the same prompt. Stores are deferred until the engine's ``before_free`` fence or
``on_finished``, like an asynchronous store, so an engine that reused or poisoned a block
before fencing would store NaN and fail the restore tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvtier.coverage import admissible_boundaries, retained_blocks
from kvtier.engine import BlockIds, BlockTables, EngineConfig, GroupSpec, Request
from kvtier.layout import Layout

Key = tuple[tuple[int, ...], int, int]  # (prompt, group, logical block)


def mixed_config(**overrides: object) -> EngineConfig:
    """Full + sliding window (W=6, E=1, not a block multiple) + chunked local (C=6)."""
    groups = (
        GroupSpec("full", num_layers=1, tokens_per_block=4, blocks_per_chunk=2),
        GroupSpec("sliding_window", num_layers=2, tokens_per_block=4, window=6,
                  extra_retained=1),
        GroupSpec("chunked_local", num_layers=1, tokens_per_block=4, chunk=6),
    )
    return EngineConfig(groups=groups, **overrides)  # type: ignore[arg-type]


def prompt(length: int, salt: int) -> list[int]:
    """A deterministic prompt of token ids in [0, 256)."""
    return [(i * 37 + salt * 101 + (i * i) % 13) % 256 for i in range(length)]


def flip_sign_bytes(block: torch.Tensor) -> None:
    """Flip the sign byte of every fp32 value of one block, in place (negates it)."""
    block.view(torch.uint8)[..., 3::4].bitwise_xor_(0x80)


@dataclass
class Events:
    """Every hook call, in order, as (hook name, request id, argument)."""

    calls: list[tuple[str, str, object]] = field(default_factory=list)

    def names(self, request_id: str) -> list[str]:
        return [name for name, rid, _ in self.calls if rid == request_id]


class SnapshotCache:
    """A KV store double: records blocks cold, restores them into later identical prompts."""

    def __init__(self, layout: Layout, fail_loads: bool = False) -> None:
        self.layout = layout
        self.fail_loads = fail_loads
        self.corrupt: tuple[int, int] | None = None
        """(group, logical block) to flip after restoring it: the negative control."""
        self.saved: dict[Key, list[torch.Tensor]] = {}
        self.pending: dict[Key, int] = {}
        self.to_load: dict[str, BlockTables] = {}
        self.events = Events()
        self.kv_caches: list[list[torch.Tensor]] = []

    def register_kv_caches(self, kv_caches: list[list[torch.Tensor]]) -> None:
        self.kv_caches = kv_caches

    def lookup(self, request: Request) -> int:
        hit = 0
        for b in admissible_boundaries(self.layout, request.num_prompt_tokens,
                                       request.num_prompt_tokens):
            if self._has_all(request.prompt_token_ids, b):
                hit = b
        self.events.calls.append(("lookup", request.request_id, hit))
        return hit

    def _has_all(self, prompt: tuple[int, ...], b: int) -> bool:
        return all(
            (prompt, g, i) in self.saved
            for g, group in enumerate(self.layout.groups)
            for i in retained_blocks(group, b)
        )

    def on_allocated(self, request: Request, hit_tokens: int, block_tables: BlockTables) -> None:
        self.events.calls.append(("on_allocated", request.request_id, block_tables))
        self.to_load[request.request_id] = block_tables

    def wait_loaded(self, request: Request) -> bool:
        """Loads run here, late, as if they had been asynchronous."""
        self.events.calls.append(("wait_loaded", request.request_id, None))
        if self.fail_loads:
            return False
        tables = self.to_load.pop(request.request_id)
        for g, table in enumerate(tables):
            for i, block in enumerate(table):
                if block is not None:
                    self._restore(request.prompt_token_ids, g, i, block)
        return True

    def _restore(self, prompt: tuple[int, ...], g: int, i: int, block: int) -> None:
        for tensor, saved in zip(self.kv_caches[g], self.saved[(prompt, g, i)], strict=True):
            tensor[block] = saved
            if self.corrupt == (g, i):
                flip_sign_bytes(tensor[block])

    def on_computed(self, request: Request, num_computed_tokens: int,
                    block_tables: BlockTables) -> None:
        self.events.calls.append(("on_computed", request.request_id, num_computed_tokens))
        for g, table in enumerate(block_tables):
            for i, block in enumerate(table):
                if block is not None:
                    self.pending[(request.prompt_token_ids, g, i)] = block

    def before_free(self, request: Request, block_ids: BlockIds) -> None:
        self.events.calls.append(("before_free", request.request_id, block_ids))
        self.flush()

    def on_finished(self, request: Request) -> None:
        self.events.calls.append(("on_finished", request.request_id, None))

    def flush(self) -> None:
        """Run every deferred store: copy the blocks' bytes as they are now."""
        for (p, g, i), block in self.pending.items():
            self.saved[(p, g, i)] = [t[block].clone() for t in self.kv_caches[g]]
        self.pending.clear()
