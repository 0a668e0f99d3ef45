"""From a job's copies to batches the mover runs: checked, grouped, sorted.

Every check a caller can fail happens here, at submit time, so that a bad spec raises
``ValueError`` in the caller's thread instead of failing a job later. A batch holds the
copies of one group with one shape ``(first_block, num_blocks)``, sorted by slot address,
so that they move with one batched ``index_select`` / ``index_copy_`` per (block position,
layer piece), and slots that sit evenly spaced in one slab can be addressed as one view.
Copies whose engine blocks are consecutive ids (what a fresh allocator hands out) form
batches of their own, marked ``consecutive``: there a layer's blocks move in runs of
several blocks per copy (see :func:`kvtier.transfer.torch_copier.placements`).

The checks and the grouping run over arrays (one entry per copy, or per block id), so a
job of thousands of copies costs one short Python pass to read them, not a pass per check;
when a check finds a bad copy, the per-copy check of that copy writes the message.

Example: a load of chunks 1 (block 3 only), 2 and 3 of a 4-block group makes two batches:
chunks 2 and 3 (shape ``(0, 4)``), then chunk 1 (shape ``(3, 1)``); if chunk 3's blocks
were ``(8, 9, 10, 11)`` and chunk 2's ``(5, 1, 7, 2)``, chunk 3 would be a batch of its own.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from kvtier.transfer.copies import ChunkCopy, Direction, SlotRef, as_copies
from kvtier.transfer.slots import slot_addresses
from kvtier.transfer.views import GroupView

try:  # the compiled build reads a job's copies in one C pass (setup.py, NATIVE)
    from kvtier import _native
except ImportError:  # the pure build: numpy over Python iterators
    _native = None  # type: ignore[assignment]

T = TypeVar("T")
_GROUP = operator.attrgetter("group")
_FIRST = operator.attrgetter("first_block")
_IDS = operator.attrgetter("block_ids")
_SLOT = operator.attrgetter("slot")


@dataclass(frozen=True)
class Batch:
    """Copies of one group and one shape ``(first_block, num_blocks)``, by slot address.

    ``ids[p, i]`` is the engine block at chunk position ``first_block + p`` of copy ``i``;
    ``ptrs[i]`` is the address of copy ``i``'s slot, ``refs[i]`` the slot itself: a tensor,
    or a row index of the registered ``slab``. ``consecutive``: every copy's blocks are
    consecutive ids, ``ids[p, i] == ids[0, i] + p``.
    """

    view: GroupView
    copies: tuple[ChunkCopy, ...]
    refs: tuple[torch.Tensor | int, ...]
    ids: np.ndarray
    ptrs: np.ndarray
    consecutive: bool = False
    slab: torch.Tensor | None = None

    def slot(self, i: int) -> torch.Tensor:
        """Copy ``i``'s slot as a tensor (a row of the slab for a row index)."""
        ref = self.refs[i]
        if isinstance(ref, torch.Tensor):
            return ref
        assert self.slab is not None  # plan_job keeps row indices only with a slab
        return self.slab[ref]

    @property
    def slots(self) -> tuple[torch.Tensor, ...]:
        """Every copy's slot as a tensor."""
        return tuple(self.slot(i) for i in range(len(self.refs)))

    @property
    def first_block(self) -> int:
        return self.copies[0].first_block

    @property
    def num_blocks(self) -> int:
        return int(self.ids.shape[0])

    def split(self, size: int) -> list[Batch]:
        """Consecutive parts of at most ``size`` copies (at least one each)."""
        size = max(1, size)
        return [
            Batch(self.view, self.copies[i : i + size], self.refs[i : i + size],
                  self.ids[:, i : i + size], self.ptrs[i : i + size], self.consecutive,
                  self.slab)
            for i in range(0, len(self.copies), size)
        ]


@dataclass(frozen=True)
class _Table:
    """A job's copies as arrays: one entry per copy, block ids flat (``starts`` into them),
    and their slots. Where the compiled build read them (:func:`_read_native`), also:
    ``rows``, every slot as a slab row index, where all are ints; ``runs``, whether each
    copy's block ids are consecutive; ``bad``, the first copy out of range (-1: none);
    ``repeated``, whether a load writes an engine block twice or a store names a slab row
    twice (-1: not known). Else None, None, None, -1: the methods and the plan's own checks
    compute them."""

    copies: tuple[ChunkCopy, ...]
    groups: np.ndarray
    firsts: np.ndarray
    counts: np.ndarray
    starts: np.ndarray
    ids: np.ndarray
    slots: list[SlotRef]
    rows: np.ndarray | None = None
    runs: np.ndarray | None = None
    bad: int | None = None
    repeated: int = -1

    @classmethod
    def of(cls, copies: Sequence[ChunkCopy] | ChunkCopy) -> _Table:
        """The job's table, read in Python; ``ValueError`` where a copy is not a
        :class:`ChunkCopy`."""
        items = as_copies(copies)
        n = len(items)
        id_tuples = list(map(_IDS, items))
        counts = np.fromiter(map(len, id_tuples), np.int64, n)
        ids = np.fromiter(itertools.chain.from_iterable(id_tuples), np.int64, int(counts.sum()))
        return cls(tuple(items), np.fromiter(map(_GROUP, items), np.int64, n),
                   np.fromiter(map(_FIRST, items), np.int64, n),
                   counts, np.cumsum(counts) - counts, ids, list(map(_SLOT, items)))

    def shape_keys(self) -> np.ndarray:
        """One integer per copy, equal for copies of one group and shape."""
        span = int(max(self.firsts.max(), self.counts.max())) + 1
        return (self.groups * span + self.firsts) * span + self.counts

    def consecutive(self) -> np.ndarray:
        """Per copy: are its block ids consecutive (``(8, 9, 10)`` yes, ``(8, 10)`` no)?

        Example: ids ``(4, 5) (7, 3) (2,)`` give ``[True, False, True]``.
        """
        if self.runs is not None:
            return self.runs
        steps = np.diff(self.ids) != 1  # steps[k]: ids[k] -> ids[k + 1] breaks a run
        breaks = np.concatenate(([0], np.cumsum(steps)))  # breaks before each flat id
        ends = self.starts + self.counts - 1
        return breaks[ends] == breaks[self.starts]

    def first_bad(self, views: Sequence[GroupView]) -> int | None:
        """The first copy whose group, chunk positions or block ids are out of range."""
        bad = (self.groups < 0) | (self.groups >= len(views))
        group = np.where(bad, 0, self.groups)
        per_slot = np.array([v.blocks_per_slot for v in views])[group]
        blocks = np.array([v.num_blocks for v in views])[group]
        bad |= self.firsts + self.counts > per_slot
        bad |= np.maximum.reduceat(self.ids, self.starts) >= blocks
        return int(np.argmax(bad)) if bad.any() else None


def plan_job(
    views: Sequence[GroupView], direction: Direction, copies: Sequence[ChunkCopy] | ChunkCopy,
    slab: torch.Tensor | None = None,
) -> list[Batch]:
    """Check every copy of a job (one copy, or a sequence) and group it into batches (raises
    ``ValueError``).

    ``slab``: the registered slab (:func:`kvtier.transfer.slots.register_slab`) whose rows
    copies may name by index."""
    read = _read_native(copies, views, slab, direction == "load")
    if isinstance(read, Batch):
        return [read]
    table = _Table.of(copies) if read is None else read
    if not table.copies:
        return []
    bad = table.first_bad(views) if table.bad is None else table.bad
    if bad is not None and bad >= 0:
        _check_copy(views, bad, table.copies[bad])
    need = np.array([v.chunk_bytes for v in views], np.int64)[table.groups]
    slots, ptrs = slot_addresses(table.slots, need, slab, table.rows)
    if table.repeated == 0:
        pass  # read_job found no repeated block (load) or slab row (store: disjoint bytes)
    elif direction == "store":
        if slab is None or table.rows is None or not _distinct(table.rows, slab.shape[0]):
            _check_slots_distinct(views, table, ptrs)  # (distinct rows: disjoint bytes)
    else:
        _check_blocks_distinct(views, table)
    return _batches(views, table, slots, ptrs, slab)


def _read_native(copies: Sequence[ChunkCopy] | ChunkCopy, views: Sequence[GroupView],
                 slab: torch.Tensor | None, load: bool) -> Batch | _Table | None:
    """A list of copies read and checked in one C pass (``_native.read_job``): the job's one
    batch where it is one (a group, a shape, ascending slab rows) and passed every check,
    else its table; None in the pure build, or where a copy is not what a
    :class:`ChunkCopy` holds (Python then reads them, and says what is wrong)."""
    if _native is None or not isinstance(copies, list):
        return None
    rows, ptr, row_bytes = (0, 0, 0) if slab is None else (
        slab.shape[0], slab.data_ptr(), slab.stride(0))
    read = _native.read_job(copies, ChunkCopy, np.array([v.num_blocks for v in views], np.int64),
                            np.array([v.blocks_per_slot for v in views], np.int64), rows, ptr,
                            row_bytes, load)
    items = tuple(copies)
    if read is None or len(read[2]) != len(items):  # (a getattr changed the list meanwhile)
        return None
    n = len(items)
    flat, ints, slots, one = np.frombuffer(read[0], np.int64), read[1], read[2], read[4]
    if one is not None:  # one batch: ids [positions x copies], then slot addresses
        m = int(flat[2 * n])
        both = np.frombuffer(one, np.int64)
        return Batch(views[int(flat[0])], items, tuple(slots), both[: m * n].reshape(m, n),
                     both[m * n :], bool(flat[4 * n]), slab)
    counts = flat[2 * n : 3 * n]
    return _Table(items, flat[:n], flat[n : 2 * n], counts, np.cumsum(counts) - counts,
                  flat[5 * n :], slots, flat[3 * n : 4 * n] if ints else None,
                  flat[4 * n : 5 * n] != 0, read[3], read[5])


def _batches(views: Sequence[GroupView], table: _Table, slots: Sequence[torch.Tensor | int],
             ptrs: np.ndarray, slab: torch.Tensor | None) -> list[Batch]:
    runs = table.consecutive()
    keys = table.shape_keys() * 2 + runs
    order = np.lexsort((ptrs, keys))
    edges = np.flatnonzero(np.diff(keys[order])) + 1
    batches = []
    for part in np.split(order, edges):
        first, rows = int(part[0]), part.tolist()
        count = int(table.counts[first])
        ids = table.ids[table.starts[part][None, :] + np.arange(count)[:, None]]
        batches.append(Batch(views[int(table.groups[first])], _pick(table.copies, rows),
                             _pick(slots, rows),
                             np.ascontiguousarray(ids), ptrs[part], bool(runs[first]), slab))
    return batches


def _pick(items: Sequence[T], rows: list[int]) -> tuple[T, ...]:
    """``tuple(items[i] for i in rows)``, in one C call (a job of thousands of copies)."""
    if len(rows) == 1:
        return (items[rows[0]],)
    return operator.itemgetter(*rows)(items)


def _check_copy(views: Sequence[GroupView], i: int, copy: ChunkCopy) -> None:
    where = f"copy {i}"
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


def _distinct(values: np.ndarray, bound: int) -> bool:
    """Whether ``values`` (each in ``[0, bound)``) are all different, by marking each."""
    seen = np.zeros(bound, np.bool_)
    seen[values] = True
    return int(np.count_nonzero(seen)) == len(values)


def _check_slots_distinct(views: Sequence[GroupView], table: _Table, ptrs: np.ndarray) -> None:
    """A store writes each slot byte once."""
    los, his = [], []
    shapes = table.shape_keys()
    for key in np.unique(shapes):
        mine = shapes == key
        i = int(np.argmax(mine))
        view = views[int(table.groups[i])]
        spans = np.array(view.byte_ranges(int(table.firsts[i]), int(table.counts[i])), np.int64)
        los.append((ptrs[mine][:, None] + spans[:, 0]).ravel())
        his.append((ptrs[mine][:, None] + spans[:, 1]).ravel())
    lo, hi = np.concatenate(los), np.concatenate(his)
    order = np.argsort(lo, kind="stable")
    reach = np.maximum.accumulate(hi[order])  # ranges of one copy never overlap each other
    if (lo[order][1:] < reach[:-1]).any():
        seen = _first_duplicate(_slot_ranges(views, table.copies, ptrs))
        assert seen is not None
        raise ValueError(f"store: copies {seen[0]} and {seen[1]} write overlapping slot bytes")


def _check_blocks_distinct(views: Sequence[GroupView], table: _Table) -> None:
    """A load writes each engine block once."""
    span = max(v.num_blocks for v in views)
    keys = np.repeat(table.groups, table.counts) * span + table.ids  # first_bad: in range
    size = len(views) * span
    if size <= 64 * len(keys) + (1 << 20):  # a mark per block: a fifth of a sort's time
        repeated = not _distinct(keys, size)
    else:
        keys = np.sort(keys)
        repeated = bool((keys[1:] == keys[:-1]).any())
    if repeated:
        blocks = ((c.group, b) for c in table.copies for b in c.block_ids)
        dup = _first_repeat(blocks)
        assert dup is not None
        raise ValueError(f"load: engine block {dup[1]} of group {dup[0]} is written twice")


def _slot_ranges(
    views: Sequence[GroupView], copies: Sequence[ChunkCopy], ptrs: np.ndarray
) -> Iterator[tuple[int, int, int]]:
    for i, (c, ptr) in enumerate(zip(copies, ptrs.tolist(), strict=True)):
        for lo, hi in views[c.group].byte_ranges(c.first_block, c.num_blocks):
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
