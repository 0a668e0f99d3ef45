"""Choosing the hit: the largest admissible boundary whose chunks are all available.

A lookup never assumes which boundaries a producer served (DESIGN section 3): it walks the
candidate boundaries from the largest down, classifies each chunk the first time a
candidate needs it (one batched store lookup per group and candidate that brings new
chunks into view), and stops at the first candidate whose chunks are all ready. Load
ranges only move left as the boundary shrinks, so a 131k-token prompt costs
O(chunks + boundaries x log chunks), not O(chunks x boundaries); a prompt stored whole
stops at its first candidate.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier import coverage
from kvtier.keys import ChunkKey, KeyChain
from kvtier.layout import Group, Layout
from kvtier.store.results import ChunkState


@dataclass(frozen=True)
class Availability:
    """For each candidate boundary, whether its chunks are ready now, or soon.

    ``ready``: readable and not being loaded by another request (loading it again would
    load it twice). ``readable``: readable at all. ``soon``: readable, being written, or
    being loaded by another request.
    """

    best_ready: int
    best_readable: int
    best_soon: int


def candidate_boundaries(
    layout: Layout, num_prompt_tokens: int, on_device: int, max_load_tokens: int | None
) -> list[int]:
    """Admissible consumer boundaries past ``on_device``, largest first."""
    bounds = coverage.admissible_boundaries(layout, num_prompt_tokens, num_prompt_tokens)
    low = bisect_right(bounds, on_device)
    high = len(bounds) if max_load_tokens is None else bisect_right(
        bounds, on_device + max_load_tokens)
    return list(bounds[low:high][::-1])


def ready_at(
    layout: Layout,
    chain: KeyChain,
    b: int,
    on_device: int,
    states: Callable[[list[ChunkKey]], list[ChunkState]],
    loading_elsewhere: Callable[[ChunkKey], bool] | None,
) -> list[list[ChunkKey]] | None:
    """The fast path: per group, the key of each chunk a hit at ``b`` loads (in chunk
    order), if every one is ready (the common case of a prompt stored whole), else None."""
    keys = [chain.keys(gi, coverage.load_chunks(g, b, on_device))
            for gi, g in enumerate(layout.groups)]
    lasts = [k[-1] for k in keys if k]  # a partial hit usually lacks its last chunks:
    if ChunkState.ABSENT in states(lasts):  # one small lookup says so
        return None
    flat = keys[0] if len(keys) == 1 else [*itertools.chain.from_iterable(keys)]
    if loading_elsewhere is not None and any(map(loading_elsewhere, flat)):
        return None
    found = states(flat)
    if ChunkState.ABSENT in found or ChunkState.WRITING in found:  # C-speed identity scans
        return None
    return keys


def hit_keys(
    layout: Layout, keys: list[dict[int, ChunkKey]], b: int, on_device: int
) -> list[list[ChunkKey]]:
    """Per group, the key of each chunk a hit at ``b`` loads, from ``assess``'s keys."""
    return [[keys[gi][c] for c in coverage.load_chunks(g, b, on_device)]
            for gi, g in enumerate(layout.groups)]


def common_chunks(layout: Layout, candidates: Sequence[int], on_device: int) -> list[range]:
    """Per group, chunks every candidate boundary loads (``candidates`` largest first).

    For groups where a chunk is needed only with its predecessor (full attention), load
    ranges are prefixes past ``on_device`` that only grow with the boundary: the chunks
    common to all candidates are the smallest candidate's. If one of them can never be
    had, no candidate can, and the lookup is a miss at once. Other groups answer an empty
    range (their ranges may be empty at some boundaries: chunked local attention).
    Example: full attention, 16-token chunks, candidates 64..16, nothing on device: chunk 0.
    """
    bottom = candidates[-1]
    return [_common(g, coverage.load_chunks(g, bottom, on_device)) for g in layout.groups]


def _common(group: Group, bottom: range) -> range:
    """``common_chunks`` of one group, from the smallest candidate's load range."""
    return bottom if coverage.needs_predecessor(group) else range(0)


def assess(
    layout: Layout,
    chain: KeyChain,
    candidates: Sequence[int],
    on_device: int,
    states: Callable[[list[ChunkKey]], list[ChunkState]],
    loading_elsewhere: Callable[[ChunkKey], bool] | None,
) -> tuple[Availability, list[dict[int, ChunkKey]]]:
    """Classify the chunks the candidates need and find the best boundary of each kind.

    First classifies, per group, every chunk between the smallest and the largest
    candidate's load ranges (one batched store lookup per group); a kind that fails on a
    chunk every candidate needs (``common_chunks``) is settled at ``on_device`` at once.
    Then walks ``candidates`` (largest first) until every kind is settled: the first
    candidate whose chunks all pass a kind is that kind's best. Returns the availability
    and, per group, the key of every chunk classified (which includes every chunk the best
    ready and best readable boundaries load).
    """
    walks = [_GroupWalk(gi, g) for gi, g in enumerate(layout.groups)]
    best = [on_device, on_device, on_device]
    if not candidates:
        return Availability(*best), [w.keys for w in walks]
    settled = [False, False, False]
    tops = []
    for w in walks:
        top = coverage.load_chunks(w.group, candidates[0], on_device)
        bottom = coverage.load_chunks(w.group, candidates[-1], on_device)
        w.prefetch(top, bottom, chain, states, loading_elsewhere)
        fails = w.fails(_common(w.group, bottom))
        settled = [was or fail for was, fail in zip(settled, fails, strict=True)]
        tops.append(top)
    for i, b in enumerate(candidates):
        if all(settled):
            break
        ok = [True, True, True]
        for w, top in zip(walks, tops, strict=True):
            chunks = top if i == 0 else coverage.load_chunks(w.group, b, on_device)
            w.classify(chunks, chain, states, loading_elsewhere)
            ok = [good and not fail for good, fail in zip(ok, w.fails(chunks), strict=True)]
        for which in range(3):
            if ok[which] and not settled[which]:
                best[which], settled[which] = b, True
    return Availability(*best), [w.keys for w in walks]


_READY, _PINNED, _ABSENT = ChunkState.READY, ChunkState.PINNED, ChunkState.ABSENT


class _GroupWalk:
    """One group's chunks classified so far, as the candidates are walked downwards.

    Every chunk is classified once. ``prefetch`` classifies every chunk between the
    smallest and the largest candidate's load ranges: both ends of a load range never
    decrease as the boundary grows, so every candidate's range lies in between and
    ``classify`` answers in O(1); a range outside is checked chunk by chunk. ``bad[k]``
    holds, sorted, the chunks that fail kind ``k`` (0 ready, 1 readable, 2 soon; see
    ``Availability``). Example: sliding window 128 in 64-token chunks, candidates 640 down
    to 64: chunks 0-9 in one store lookup.
    """

    def __init__(self, gi: int, group: Group) -> None:
        self.gi, self.group = gi, group
        self.keys: dict[int, ChunkKey] = {}
        self.bad: tuple[list[int], list[int], list[int]] = ([], [], [])
        self._seen = range(0)

    def prefetch(
        self, top: range, bottom: range, chain: KeyChain,
        states: Callable[[list[ChunkKey]], list[ChunkState]],
        loading_elsewhere: Callable[[ChunkKey], bool] | None,
    ) -> None:
        """Classify every chunk from the start of ``bottom`` to the end of ``top``."""
        ends = [r for r in (top, bottom) if r]
        if ends:
            hull = range(min(r.start for r in ends), max(r.stop for r in ends))
            self.classify(hull, chain, states, loading_elsewhere)
            self._seen = hull

    def classify(
        self, chunks: range, chain: KeyChain,
        states: Callable[[list[ChunkKey]], list[ChunkState]],
        loading_elsewhere: Callable[[ChunkKey], bool] | None,
    ) -> None:
        """Classify the chunks of ``chunks`` not seen yet (one batched store lookup)."""
        seen = self._seen
        if not chunks or (seen.start <= chunks.start and chunks.stop <= seen.stop):
            return
        todo = [c for c in chunks if c not in self.keys]
        if not todo:
            return
        ks = chain.keys(self.gi, todo)
        self.keys.update(zip(todo, ks, strict=True))
        ready, readable, soon = self.bad
        for c, k, st in zip(todo, ks, states(ks), strict=True):
            ok = st is _READY or st is _PINNED
            other = loading_elsewhere is not None and loading_elsewhere(k)
            if not ok or other:
                insort(ready, c)
            if not ok:
                insort(readable, c)
            if not (ok or other) and st is _ABSENT:
                insort(soon, c)

    def fails(self, chunks: range) -> tuple[bool, bool, bool]:
        """Whether a chunk of ``chunks`` (all classified) fails each kind. A chunk that
        fails soon fails readable, and one that fails readable fails ready."""
        if not chunks or not _any_in(self.bad[0], chunks):
            return _PASS
        if not _any_in(self.bad[1], chunks):
            return _NOT_READY
        return (True, True, _any_in(self.bad[2], chunks))


_PASS, _NOT_READY = (False, False, False), (True, False, False)


def _any_in(sorted_chunks: list[int], chunks: range) -> bool:
    i = bisect_left(sorted_chunks, chunks.start)
    return i < len(sorted_chunks) and sorted_chunks[i] < chunks.stop
