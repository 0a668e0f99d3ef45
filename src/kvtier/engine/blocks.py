"""Paged KV storage: per-group block pools, per-request block tables, per-layer tensors.

Each layer owns one tensor ``[num_blocks, 2, tokens_per_block, kv_heads, head_dim]`` (dim
1: index 0 keys, 1 values). Layers of one group share that group's block ids: block 5 of
group 1 is row 5 of every group-1 layer's tensor. A request's block table maps *logical*
block ``i`` (tokens ``[i*T, (i+1)*T)``) to a physical block id, or to ``None`` when the
request holds no block there (never allocated, or freed because it left the retained span).

Unwritten and freed blocks are filled with NaN: a read of KV the engine never computed or
restored shows up as NaN logits instead of a plausible wrong answer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import torch

from kvtier.engine.config import EngineConfig


class OutOfBlocksError(RuntimeError):
    """A group's pool is empty. The reference engine does not preempt: raise num_blocks."""


class BlockPool:
    """The free list of one group's physical blocks.

    Example: a pool of 4 hands out 0, 1, 2, 3; after ``free([1])`` the next block is 1.
    """

    def __init__(self, num_blocks: int, group_index: int) -> None:
        self.num_blocks = num_blocks
        self.group_index = group_index
        self._free: deque[int] = deque(range(num_blocks))
        self._in_use: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocksError(
                f"group {self.group_index}: all {self.num_blocks} KV blocks are in use; "
                "raise EngineConfig.num_blocks or lower max_running"
            )
        block = self._free.popleft()
        self._in_use.add(block)
        return block

    def free(self, block_ids: Iterable[int]) -> None:
        for block in block_ids:
            assert block in self._in_use, f"group {self.group_index}: double free of {block}"
            self._in_use.remove(block)
            self._free.append(block)

    def reset(self) -> None:
        """Forget every allocation: all blocks free, in id order."""
        self._free = deque(range(self.num_blocks))
        self._in_use.clear()


class BlockTable:
    """One request's logical-to-physical block map for one group.

    Example: after ``assign(2, 7)`` the table is ``(None, None, 7)``: the request holds
    physical block 7 for tokens ``[2T, 3T)`` and nothing below.
    """

    def __init__(self) -> None:
        self._ids: list[int | None] = []

    def __getitem__(self, index: int) -> int | None:
        return self._ids[index] if index < len(self._ids) else None

    def assign(self, index: int, block: int) -> None:
        assert self[index] is None, f"logical block {index} is already held"
        self._ids.extend([None] * (index + 1 - len(self._ids)))
        self._ids[index] = block

    def release(self, index: int) -> int:
        """Null logical block ``index`` and return the physical id it held."""
        block = self._ids[index]
        assert block is not None, f"logical block {index} is not held"
        self._ids[index] = None
        return block

    def physical(self, indices: Iterable[int]) -> tuple[int, ...]:
        """The physical ids held at these logical indices (each must be held)."""
        ids = tuple(self._ids[i] for i in indices)
        assert None not in ids, "asked for the physical id of a block that is not held"
        return tuple(b for b in ids if b is not None)

    def held(self) -> list[int]:
        """Logical indices that hold a physical block, ascending."""
        return [i for i, b in enumerate(self._ids) if b is not None]

    def snapshot(self) -> tuple[int | None, ...]:
        return tuple(self._ids)


class PagedKVCache:
    """All layers' KV tensors, group outermost, with their group's pools.

    Layers are the target's, then one per draft module (layer ``num_layers + m - 1`` in group
    ``len(groups) + m - 1``). A recurrent layer (target ``state`` group) holds one state row
    per block: ``[num_blocks, state_numel]`` (``kvtier.engine.recurrent``). The draft tail's
    ``hidden`` state group holds one tensor ``[num_blocks, tokens_per_block, hidden_size]``
    and no layer.
    """

    def __init__(self, config: EngineConfig) -> None:
        assert config.layer_groups is not None
        self.config = config
        layout = config.layout()
        self._tpb = [g.tokens_per_block for g in layout.groups]
        self.kv_caches: list[list[torch.Tensor]] = [[] for _ in layout.groups]
        self._where: list[tuple[int, int]] = []
        drafts = range(len(config.groups), len(config.groups) + config.num_draft_modules)
        for group in (*config.layer_groups, *drafts):
            self._where.append((group, len(self.kv_caches[group])))
            self.kv_caches[group].append(self._new_tensor(group))
        for g in range(len(config.groups) + config.num_draft_modules, len(layout.groups)):
            if layout.groups[g].kind == "state":  # the hidden states of the draft tail
                shape = (config.num_blocks, self._tpb[g], config.hidden_size)
                self.kv_caches[g].append(torch.full(shape, float("nan"), dtype=torch.float32))
        self.pools = [BlockPool(config.num_blocks, g) for g in range(len(layout.groups))]

    def _new_tensor(self, group: int) -> torch.Tensor:
        cfg = self.config
        shape: tuple[int, ...]
        if group < len(cfg.groups) and cfg.groups[group].kind == "state":
            shape = (cfg.num_blocks, cfg.recurrent_shape.state_numel)
        else:
            shape = (cfg.num_blocks, 2, self._tpb[group], cfg.num_kv_heads, cfg.head_dim)
        return torch.full(shape, float("nan"), dtype=torch.float32)

    def read_row(self, layer: int, table: BlockTable, block: int) -> torch.Tensor:
        """A recurrent layer's state row in logical block ``block`` (which must be held)."""
        physical = table[block]
        assert physical is not None, f"layer {layer}: state block {block} is not held"
        return self._tensor(layer)[physical].clone()

    def write_row(self, layer: int, table: BlockTable, block: int, row: torch.Tensor) -> None:
        """Write a recurrent layer's state row into logical block ``block``."""
        physical = table[block]
        assert physical is not None, f"layer {layer}: writing state to unheld block {block}"
        self._tensor(layer)[physical] = row

    def write_state(self, group: int, table: BlockTable, start: int, rows: torch.Tensor) -> None:
        """Write per-position rows (hidden states) of ``start ..`` into a state group's blocks.

        Example: 16-token blocks, ``start = 60``, 8 rows: rows 0..3 go to logical block 3
        (offsets 12..15), rows 4..7 to logical block 4 (offsets 0..3).
        """
        tpb = self._tpb[group]
        positions = range(start, start + rows.shape[0])
        blocks = [table[p // tpb] for p in positions]
        assert None not in blocks, f"state group {group}: writing to an unallocated block"
        ids = torch.tensor(blocks, dtype=torch.long)
        offsets = torch.tensor([p % tpb for p in positions], dtype=torch.long)
        self.kv_caches[group][0][ids, offsets] = rows

    def read_state(self, group: int, table: BlockTable, block: int) -> torch.Tensor:
        """The rows ``[tokens_per_block, hidden_size]`` of one held logical block."""
        physical = table[block]
        assert physical is not None, f"state group {group}: block {block} is not held"
        return self.kv_caches[group][0][physical].clone()

    def group_of(self, layer: int) -> int:
        return self._where[layer][0]

    def _tensor(self, layer: int) -> torch.Tensor:
        group, slot = self._where[layer]
        return self.kv_caches[group][slot]

    def write(
        self, layer: int, table: BlockTable, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write KV of positions ``start .. start + len(k) - 1`` through ``table``."""
        tpb = self._tpb[self.group_of(layer)]
        positions = range(start, start + k.shape[0])
        blocks = [table[p // tpb] for p in positions]
        assert None not in blocks, f"layer {layer}: writing to an unallocated block"
        ids = torch.tensor(blocks, dtype=torch.long)
        offsets = torch.tensor([p % tpb for p in positions], dtype=torch.long)
        cache = self._tensor(layer)
        cache[ids, 0, offsets] = k
        cache[ids, 1, offsets] = v

    def gather(
        self, layer: int, table: BlockTable, lo: int, hi: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[hi - lo, kv_heads, head_dim]`` of positions ``[lo, hi)``.

        Example: 4-token blocks, ``lo = 6, hi = 13``: reads logical blocks 1, 2, 3 and
        drops the first 2 and last 3 rows.
        """
        tpb = self._tpb[self.group_of(layer)]
        first, last = lo // tpb, -(-hi // tpb)
        blocks = [table[i] for i in range(first, last)]
        assert None not in blocks, f"layer {layer}: reading a block that is not held"
        rows = self._tensor(layer)[torch.tensor(blocks, dtype=torch.long)]
        shape = (-1, self.config.num_kv_heads, self.config.head_dim)
        k = rows[:, 0].reshape(shape)[lo - first * tpb : hi - first * tpb]
        v = rows[:, 1].reshape(shape)[lo - first * tpb : hi - first * tpb]
        return k, v

    def poison(self, group: int, block_ids: list[int]) -> None:
        """Fill blocks with NaN so that any later read of them shows."""
        if block_ids:
            index = torch.tensor(block_ids, dtype=torch.long)
            for tensor in self.kv_caches[group]:
                tensor[index] = float("nan")

    def reset(self) -> None:
        """As if the device cache were cleared: every block NaN and free."""
        for group, tensors in enumerate(self.kv_caches):
            for tensor in tensors:
                tensor.fill_(float("nan"))
            self.pools[group].reset()
