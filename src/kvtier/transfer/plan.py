"""From a job's copies to batches the mover runs: checked, grouped, sorted.

Every check a caller can fail happens here, at submit time, so that a bad spec raises
``ValueError`` in the caller's thread instead of failing a job later. A batch holds the
copies of one group with one shape ``(first_block, num_blocks)``, sorted by slot address,
so that they move with one batched ``index_select`` / ``index_copy_`` per (block position,
layer piece), and slots that sit evenly spaced in one slab can be addressed as one view.

Example: a load of chunks 1 (block 3 only), 2 and 3 of a 4-block group makes two batches:
chunks 2 and 3 (shape ``(0, 4)``), then chunk 1 (shape ``(3, 1)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby

import torch

from kvtier.transfer.spec import ChunkCopy, Direction
from kvtier.transfer.views import GroupView, slot_tensor


@dataclass(frozen=True)
class Batch:
    """Copies of one group and one shape ``(first_block, num_blocks)``, by slot address."""

    view: GroupView
    copies: tuple[ChunkCopy, ...]
    slots: tuple[torch.Tensor, ...]

    @property
    def first_block(self) -> int:
        return self.copies[0].first_block

    @property
    def num_blocks(self) -> int:
        return self.copies[0].num_blocks

    def block_ids(self) -> torch.Tensor:
        """``[num_blocks, len(copies)]`` engine block ids, position-major."""
        return torch.tensor([c.block_ids for c in self.copies], dtype=torch.int64).T.contiguous()

    def split(self, size: int) -> list[Batch]:
        """Consecutive parts of at most ``size`` copies (at least one each)."""
        size = max(1, size)
        return [
            Batch(self.view, self.copies[i : i + size], self.slots[i : i + size])
            for i in range(0, len(self.copies), size)
        ]


def _shape(copy: ChunkCopy) -> tuple[int, int]:
    return (copy.first_block, copy.num_blocks)


def plan_job(
    views: Sequence[GroupView], direction: Direction, copies: Sequence[ChunkCopy]
) -> list[Batch]:
    """Check every copy of a job and group it into batches (raises ``ValueError``)."""
    slots = [_check_copy(views, i, c) for i, c in enumerate(copies)]
    _check_distinct(views, direction, copies, slots)
    pairs = sorted(
        zip(copies, slots, strict=True),
        key=lambda pair: (pair[0].group, _shape(pair[0]), pair[1].data_ptr()),
    )
    batches = []
    for (group, _), members in groupby(pairs, lambda pair: (pair[0].group, _shape(pair[0]))):
        part = list(members)
        batches.append(Batch(views[group], tuple(c for c, _ in part), tuple(s for _, s in part)))
    return batches


def _check_copy(views: Sequence[GroupView], i: int, copy: ChunkCopy) -> torch.Tensor:
    where = f"copy {i}"
    if not isinstance(copy, ChunkCopy):
        raise ValueError(f"{where}: expected a ChunkCopy, got {type(copy).__name__}")
    if not 0 <= copy.group < len(views):
        raise ValueError(f"{where}: group {copy.group} is not in the layout "
                         f"(it has {len(views)} groups)")
    view = views[copy.group]
    if copy.first_block + copy.num_blocks > view.blocks_per_slot:
        raise ValueError(
            f"{where}: blocks {copy.first_block}..{copy.first_block + copy.num_blocks - 1} "
            f"are outside the chunk; group {copy.group} holds {view.blocks_per_slot} "
            "block(s) per slot (a state chunk holds one)"
        )
    if max(copy.block_ids) >= view.num_blocks:
        raise ValueError(f"{where}: block id {max(copy.block_ids)} is out of range; group "
                         f"{copy.group} has {view.num_blocks} blocks")
    return slot_tensor(copy.slot, view.chunk_bytes, where)


def _check_distinct(
    views: Sequence[GroupView], direction: Direction, copies: Sequence[ChunkCopy],
    slots: Sequence[torch.Tensor],
) -> None:
    """A store writes each slot once; a load writes each engine block once."""
    if direction == "store":
        seen = _first_duplicate(_slot_ranges(views, copies, slots))
        if seen is not None:
            raise ValueError(f"store: copies {seen[0]} and {seen[1]} write overlapping slot bytes")
        return
    blocks = ((c.group, b) for c in copies for b in c.block_ids)
    dup = _first_repeat(blocks)
    if dup is not None:
        raise ValueError(f"load: engine block {dup[1]} of group {dup[0]} is written twice")


def _slot_ranges(
    views: Sequence[GroupView], copies: Sequence[ChunkCopy], slots: Sequence[torch.Tensor]
) -> Iterator[tuple[int, int, int]]:
    shapes: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for i, (c, s) in enumerate(zip(copies, slots, strict=True)):
        key = (c.group, c.first_block, c.num_blocks)
        if key not in shapes:
            shapes[key] = views[c.group].byte_ranges(c.first_block, c.num_blocks)
        ptr = s.data_ptr()
        for lo, hi in shapes[key]:
            yield ptr + lo, ptr + hi, i


def _first_duplicate(ranges: Iterator[tuple[int, int, int]]) -> tuple[int, int] | None:
    """Indices of two copies whose byte ranges overlap, or None."""
    last_hi, last_i = -1, -1
    for lo, hi, i in sorted(ranges):
        if lo < last_hi and i != last_i:
            return (min(i, last_i), max(i, last_i))
        if hi > last_hi:
            last_hi, last_i = hi, i
    return None


def _first_repeat(items: Iterator[tuple[int, int]]) -> tuple[int, int] | None:
    seen: set[tuple[int, int]] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None
