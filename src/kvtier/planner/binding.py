"""Binding planned chunks to what a job needs: keys, hints, slots, engine blocks.

The planner decides *which* chunks to store or load by asking ``kvtier.coverage``; this
module turns those (group, chunk) pairs into the pieces of a job: each chunk's key, its
predecessor (the eviction policies' prefix hint), its slot, the engine blocks it is copied
from or to (``coverage.store_blocks``). The fences that keep the engine from reusing those
blocks while a store job reads them are the job book's (``kvtier.planner.jobs``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Final, cast

from kvtier import coverage
from kvtier.keys import ChunkKey
from kvtier.layout import Layout
from kvtier.planner.requests import PendingHit, RequestState, block_ids_at, load_block_ids
from kvtier.planner.types import PlannedCopy
from kvtier.retention import BlockRun
from kvtier.store.results import StoreHandle

BlockTable = Sequence[Sequence[int | None]]


class LiveChunk:
    """A planned chunk whose blocks the engine still holds: ``block_ids`` are chunk-relative
    blocks ``first_block ..``. Example: ``LiveChunk(1, 3, 2, (40, 41))``. A plain class: the
    compiled build makes one and reads its fields several times faster than a named tuple's
    (a store job has one per chunk)."""

    def __init__(self, group: int, chunk: int, first_block: int, block_ids: tuple[int, ...]
                 ) -> None:
        self.group = group
        self.chunk = chunk
        self.first_block = first_block
        self.block_ids = block_ids

    def __repr__(self) -> str:
        return (f"LiveChunk({self.group}, {self.chunk}, {self.first_block}, "
                f"{self.block_ids})")


class ChunkBinder:
    """Keys, hints and blocks of planned chunks, for one layout."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        # coverage.store_blocks depends on (group, chunk) only: a pure cache of its answers,
        # as (first absolute block, number of blocks, first block in the chunk)
        self._runs: dict[tuple[int, int], tuple[int, int, int]] = {}
        # groups whose stored chunks hold every block need no store_blocks call at all
        self._whole = [g.blocks_per_chunk if coverage.stores_whole_chunks(g) else 0
                       for g in layout.groups]
        self._needs_parent = [coverage.needs_predecessor(g) for g in layout.groups]
        # per group, chunk -> its LiveChunk over a table whose ids are block positions (a
        # list by chunk index: no tuple built and hashed per chunk)
        self._identity: list[list[LiveChunk | None]] = [[] for _ in layout.groups]
        self._chunk_bytes = [g.bytes_per_chunk or 0 for g in layout.groups]  # a property

    def _run(self, gi: int, chunk: int) -> tuple[int, int, int]:
        run = coverage.store_blocks(self.layout, gi, chunk)
        first = chunk * self.layout.groups[gi].blocks_per_chunk + run.first_block
        self._runs[(gi, chunk)] = entry = (first, run.num_blocks, run.first_block)
        return entry

    def live(self, pending: Iterable[tuple[int, int]], table: BlockTable) -> list[LiveChunk]:
        """The planned chunks whose blocks the engine still holds, in order."""
        out, runs, whole = [], self._runs, self._whole
        # rows that are ranges from 0 up (the replay's tables) hold every id: no checks
        rows = [row for row in table if isinstance(row, range) and row.start >= 0
                and row.step == 1] if len(table) == len(whole) else []
        counting = len(rows) == len(whole)
        if counting and all(row.start == 0 for row in rows):
            return self._live_identity(pending, [len(row) for row in rows])
        # group -> (first block, end block, _span_kind of the row between them)
        kinds: dict[int, tuple[int, int, int]] = {}
        for gi, chunk in pending:
            bpc = whole[gi]
            if bpc:
                first, num, rel = chunk * bpc, bpc, 0
            else:
                first, num, rel = runs.get((gi, chunk)) or self._run(gi, chunk)
            if counting and num > 0:
                row = rows[gi]
                if first + num > len(row):
                    continue
                start = row[first]
                out.append(LiveChunk(gi, chunk, rel, tuple(range(start, start + num))))
                continue
            checked = kinds.get(gi)
            if checked is None or first < checked[0] or first + num > checked[1]:
                end = first + max(num, SPAN_BLOCKS)  # a bounded span: never the whole row
                checked = kinds[gi] = (first, end, _span_kind(table, gi, first, end))
            if checked[2]:  # plain ids: a slice and a None check per chunk
                part = table[gi][first : first + num]
                if len(part) == num and _held(part, checked[2]):
                    out.append(LiveChunk(gi, chunk, rel, tuple(cast("Sequence[int]", part))))
                continue
            ids = block_ids_at(table, gi, first, num)
            if ids is not None:
                out.append(LiveChunk(gi, chunk, rel, ids))
        return out

    def _live_identity(self, pending: Iterable[tuple[int, int]], lengths: list[int]
                       ) -> list[LiveChunk]:
        """``live`` over rows ``range(n)``: a block's id is its position, so a chunk's
        ``LiveChunk`` is the same in every request (kept once built); only the rows'
        lengths decide which chunks are held."""
        out, known = [], self._identity
        for gi, chunk in pending:
            row = known[gi]
            c = row[chunk] if chunk < len(row) else None
            if c is None:
                c = self._identity_chunk(gi, chunk)
            if c.block_ids and c.block_ids[-1] >= lengths[gi]:
                continue
            out.append(c)
        return out

    def _identity_chunk(self, gi: int, chunk: int) -> LiveChunk:
        bpc = self._whole[gi]
        if bpc:
            first, num, rel = chunk * bpc, bpc, 0
        else:
            first, num, rel = self._runs.get((gi, chunk)) or self._run(gi, chunk)
        c = LiveChunk(gi, chunk, rel, tuple(range(first, first + num)))
        row = self._identity[gi]
        if len(row) <= chunk:
            row += [None] * (chunk + 1 - len(row))
        row[chunk] = c
        return c

    def keys_and_parents(self, req: RequestState, chunks: Sequence[tuple[int, int]]
                         ) -> tuple[list[ChunkKey], list[ChunkKey | None]]:
        """Each (group, chunk)'s key, and its eviction hint: its predecessor's key where a
        hit needs both, else None. Hashed per run of one group's chunks in one batch: the
        planner's chunks come group outermost, ascending, so a run is usually one slice of
        the chain's keys and its parents the same slice one chunk back.
        Example: chunks 3, 4, 5 of a full-attention group -> keys k3 k4 k5, parents k2 k3 k4."""
        keys: list[ChunkKey] = []
        parents: list[ChunkKey | None] = []
        start, n = 0, len(chunks)
        while start < n:
            gi = chunks[start][0]
            end = start + 1
            while end < n and chunks[end][0] == gi:
                end += 1
            self._run_keys(req, gi, [c for _, c in chunks[start:end]], keys, parents)
            start = end
        return keys, parents

    def _run_keys(self, req: RequestState, gi: int, chunks: list[int], keys: list[ChunkKey],
                  parents: list[ChunkKey | None]) -> None:
        """``keys_and_parents`` of chunks of group ``gi``, appended to both lists."""
        chain, low, high = req.chain, chunks[0], chunks[-1]
        if high - low + 1 == len(chunks) and chunks == list(range(low, high + 1)):
            own = chain.keys(gi, range(low, high + 1))  # one slice of the built keys
            keys += own
            if not self._needs_parent[gi]:
                parents += [None] * len(own)
            elif low:
                parents += chain.keys(gi, range(low - 1, high))
            else:
                parents.append(None)
                parents += own[:-1]
            return
        keys += chain.keys(gi, chunks)
        if not self._needs_parent[gi]:
            parents += [None] * len(chunks)
            return
        wanted = [c - 1 for c in chunks if c]
        found = iter(chain.keys(gi, wanted) if wanted else [])
        parents += [next(found) if c else None for c in chunks]

    @staticmethod
    def copies(handle: StoreHandle, keys: Sequence[ChunkKey], live: Sequence[LiveChunk]
               ) -> tuple[PlannedCopy, ...]:
        """One copy per key the store reserved a slot for; ``keys[i]`` is ``live[i]``'s."""
        index = _subsequence(keys, handle.keys)
        if index is None:  # a store that reordered the keys: found by key
            where = {k: i for i, k in enumerate(keys)}
            index = [where[k] for k in handle.keys]
        out = []
        for k, slot, i in zip(handle.keys, handle.slots, index, strict=True):
            c = live[i]
            out.append(PlannedCopy(c.group, c.chunk, k, slot, c.block_ids, c.first_block))
        return tuple(out)

    def load_copies(
        self, hit: PendingHit, table: BlockTable, request_id: str
    ) -> tuple[PlannedCopy, ...]:
        """The copies of a pinned hit's load job: exactly ``coverage.load_set`` per group,
        into the engine blocks ``table`` allocated for them."""
        copies = []
        slots = dict(zip(hit.handle.keys, hit.handle.slots, strict=True))
        for gi, group in enumerate(self.layout.groups):
            runs = load_runs(self.layout, gi, hit.lookup.hit_tokens, hit.on_device)
            bpc, kind, row = group.blocks_per_chunk, _ODD, None
            if runs:  # runs ascend: the row is checked once, from the first run to the last
                last = runs[-1]
                kind = _span_kind(table, gi, runs[0].chunk * bpc + runs[0].first_block,
                                  last.chunk * bpc + last.first_block + last.num_blocks)
                row = table[gi] if kind else None
            for run, key in zip(runs, hit.keys[gi], strict=True):
                first = run.chunk * bpc + run.first_block
                part = row[first : first + run.num_blocks] if row is not None else None
                if part is not None and len(part) == run.num_blocks and _held(part, kind):
                    ids = tuple(cast("Sequence[int]", part))
                else:  # odd ids, or a block not allocated: checked one by one (and refused)
                    ids = load_block_ids(table, gi, group, run, request_id)
                copies.append(PlannedCopy(gi, run.chunk, key, slots[key], ids, run.first_block))
        return tuple(copies)

    def num_bytes(self, copies: Iterable[PlannedCopy]) -> int:
        """The layout's bytes of ``copies`` (0 for a group that gives no bytes per token)."""
        per = self._chunk_bytes
        return sum([per[c.group] for c in copies])


@functools.lru_cache(maxsize=4096)
def load_runs(layout: Layout, group_index: int, b: int, on_device: int = 0
              ) -> tuple[BlockRun, ...]:
    """``coverage.load_set`` of one group of ``layout``, cached: every hit at the same
    boundary loads the same runs, built once rather than per load job."""
    return coverage.load_set(layout.groups[group_index], b, on_device)


def _subsequence(keys: Sequence[ChunkKey], wanted: Sequence[ChunkKey]) -> list[int] | None:
    """The positions in ``keys`` of ``wanted``, found in one walk (no key hashed), or None
    unless ``wanted`` is a subsequence of ``keys``: a store hands back the keys it reserved
    in the order offered. Example: keys ``a b c``, wanted ``a c`` -> ``[0, 2]``."""
    out, j, n = [], 0, len(keys)
    for k in wanted:
        while j < n and keys[j] != k:
            j += 1
        if j == n:
            return None
        out.append(j)
        j += 1
    return out


_ODD: Final = 0
_INTS: Final = 1
_INTS_OR_NONE: Final = 2
_PLAIN: Final = frozenset((int, type(None)))


SPAN_BLOCKS = 256
"""Blocks of a row ``live`` checks in one pass at least: a step's chunks lie in a few such
spans, so the cost follows the blocks a step plans, not the row's length (a long prompt's
row has thousands)."""


def _span_kind(table: BlockTable, gi: int, first: int, end: int) -> int:
    """What group ``gi``'s row holds in blocks ``first .. end - 1``, in one C-speed pass: only
    plain ids >= 0 (``_INTS``), plain ids and None (``_INTS_OR_NONE``: a chunk's blocks then
    need a None check and a sign check), or anything else (``_ODD``: ``block_ids_at`` checks
    each chunk's ids and raises for a bad one). The engine's tables are the first two."""
    if gi >= len(table):
        return _ODD
    tail = table[gi][first:end]
    if type(tail) is range:  # ids by arithmetic (the replay's tables): its ends bound it
        return _INTS if not tail or min(tail[0], tail[-1]) >= 0 else _INTS_OR_NONE
    kinds = set(map(type, tail))
    if kinds == {int}:
        return _INTS if min(cast("Sequence[int]", tail)) >= 0 else _INTS_OR_NONE
    return _INTS_OR_NONE if kinds <= _PLAIN else _ODD


def _held(part: Sequence[int | None], kind: int) -> bool:
    """Whether the engine holds every block of ``part`` (a slice of a row ``_span_kind``
    found plain): no None and no negative id."""
    return kind == _INTS or (None not in part and (not part or min(
        cast("Sequence[int]", part)) >= 0))
