"""Binding planned chunks to what a store job needs: keys, hints, engine blocks, fences.

The planner decides *which* chunks to store by asking ``kvtier.coverage``; this module
turns those (group, chunk) pairs into the pieces of a store job: each chunk's key, its
predecessor (the eviction policies' prefix hint), the engine blocks it is copied from
(``coverage.store_blocks``), and the fences that keep the engine from reusing those blocks
while the job reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from kvtier import coverage
from kvtier.keys import ChunkKey
from kvtier.layout import Layout
from kvtier.planner.requests import RequestState, block_ids_at
from kvtier.planner.types import PlannedCopy, TransferJob
from kvtier.store.results import StoreHandle

BlockTable = Sequence[Sequence[int | None]]


class LiveChunk(NamedTuple):
    """A planned chunk whose blocks the engine still holds: ``block_ids`` are chunk-relative
    blocks ``first_block ..``. Example: ``LiveChunk(1, 3, 2, (40, 41))``."""

    group: int
    chunk: int
    first_block: int
    block_ids: tuple[int, ...]


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

    def _run(self, gi: int, chunk: int) -> tuple[int, int, int]:
        run = coverage.store_blocks(self.layout, gi, chunk)
        first = chunk * self.layout.groups[gi].blocks_per_chunk + run.first_block
        self._runs[(gi, chunk)] = entry = (first, run.num_blocks, run.first_block)
        return entry

    def live(self, pending: Iterable[tuple[int, int]], table: BlockTable) -> list[LiveChunk]:
        """The planned chunks whose blocks the engine still holds, in order."""
        out, runs, whole = [], self._runs, self._whole
        for gi, chunk in pending:
            bpc = whole[gi]
            if bpc:
                first, num, rel = chunk * bpc, bpc, 0
            else:
                first, num, rel = runs.get((gi, chunk)) or self._run(gi, chunk)
            ids = block_ids_at(table, gi, first, num)
            if ids is not None:
                out.append(LiveChunk(gi, chunk, rel, ids))
        return out

    @staticmethod
    def keys(req: RequestState, live: list[LiveChunk]) -> list[ChunkKey]:
        """Keys of the chunks, hashed per group in one batch, in the given order."""
        by_group: dict[int, list[int]] = {}
        for c in live:
            by_group.setdefault(c.group, []).append(c.chunk)
        found = {gi: iter(req.chain.keys(gi, cs)) for gi, cs in by_group.items()}
        return [next(found[c.group]) for c in live]

    def parents(self, req: RequestState, live: list[LiveChunk]) -> list[ChunkKey | None]:
        """The eviction hint: each chunk's predecessor, where a hit needs both."""
        groups = self.layout.groups
        return [
            req.chain.key(c.group, c.chunk - 1)
            if c.chunk and coverage.needs_predecessor(groups[c.group]) else None
            for c in live
        ]

    @staticmethod
    def copies(handle: StoreHandle, by_key: dict[ChunkKey, LiveChunk]) -> tuple[PlannedCopy, ...]:
        """One copy per key the store reserved a slot for."""
        out = []
        for k, slot in zip(handle.keys, handle.slots, strict=True):
            c = by_key[k]
            out.append(PlannedCopy(c.group, c.chunk, k, slot, c.block_ids, c.first_block))
        return tuple(out)


class Fences:
    """Engine blocks that store jobs in flight still read, per job and group."""

    def __init__(self, num_groups: int) -> None:
        self._num_groups = num_groups
        self._jobs: dict[int, list[frozenset[int]]] = {}

    def add(self, job: TransferJob) -> None:
        per_group: list[set[int]] = [set() for _ in range(self._num_groups)]
        for c in job.copies:
            per_group[c.group].update(c.block_ids)
        self._jobs[job.id] = [frozenset(s) for s in per_group]

    def remove(self, job_id: int) -> None:
        del self._jobs[job_id]

    def jobs_reading(self, group: int, block_ids: Iterable[int]) -> list[int]:
        """Store jobs still reading any of ``block_ids`` of ``group``, in id order."""
        wanted = set(block_ids)
        return sorted(j for j, blocks in self._jobs.items() if not blocks[group].isdisjoint(wanted))

    def clear(self) -> None:
        self._jobs.clear()

    def __len__(self) -> int:
        return len(self._jobs)
