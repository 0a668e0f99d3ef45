"""From a job's copies to batches the mover runs: checked, grouped, sorted, sized.

Every check a caller can fail happens here, at submit time, so that a bad spec raises
``ValueError`` in the caller's thread instead of failing a job later. A batch holds copies
of one group that fit the staging buffer together, sorted by ``(first_block, num_blocks)``
so that copies of one shape sit in consecutive staging rows and move with one batched
``index_select`` / ``index_copy_`` per (block position, layer piece).

Example: a load of chunks 1 (block 3 only), 2 and 3 of a 4-block group makes one batch:
``shapes() == [(0, 4, 0, 2), (3, 1, 2, 3)]`` (full chunks in rows 0..1, the tail in row 2).
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
    """Copies of one group, in staging-row order, with their slots as tensors."""

    view: GroupView
    copies: tuple[ChunkCopy, ...]
    slots: tuple[torch.Tensor, ...]

    def shapes(self) -> list[tuple[int, int, int, int]]:
        """``(first_block, num_blocks, row_lo, row_hi)`` for each run of same-shape copies."""
        out, row = [], 0
        for (first, count), members in groupby(self.copies, _shape):
            n = len(list(members))
            out.append((first, count, row, row + n))
            row += n
        return out

    def block_ids(self, lo: int, hi: int) -> torch.Tensor:
        """``[num_blocks, hi - lo]`` engine block ids of rows ``lo..hi-1``, position-major."""
        rows = [c.block_ids for c in self.copies[lo:hi]]
        return torch.tensor(rows, dtype=torch.int64).T.contiguous()


def _shape(copy: ChunkCopy) -> tuple[int, int]:
    return (copy.first_block, copy.num_blocks)


def plan_job(
    views: Sequence[GroupView], direction: Direction, copies: Sequence[ChunkCopy],
    staging_bytes: int,
) -> list[Batch]:
    """Check every copy of a job and cut the job into batches (raises ``ValueError``)."""
    slots = [_check_copy(views, i, c) for i, c in enumerate(copies)]
    _check_distinct(views, direction, copies, slots)
    batches: list[Batch] = []
    for view in views:
        mine = sorted(
            (pair for pair in zip(copies, slots, strict=True) if pair[0].group == view.index),
            key=lambda pair: _shape(pair[0]),
        )
        per_batch = max(1, staging_bytes // view.chunk_bytes)
        for start in range(0, len(mine), per_batch):
            part = mine[start : start + per_batch]
            batches.append(Batch(view, tuple(c for c, _ in part), tuple(s for _, s in part)))
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
    for i, (c, s) in enumerate(zip(copies, slots, strict=True)):
        for lo, hi in views[c.group].byte_ranges(c.first_block, c.num_blocks):
            yield s.data_ptr() + lo, s.data_ptr() + hi, i


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
