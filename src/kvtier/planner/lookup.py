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
from bisect import bisect_left, insort
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
    top = None if max_load_tokens is None else on_device + max_load_tokens
    return [b for b in reversed(bounds) if b > on_device and (top is None or b <= top)]


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
    return [
        coverage.load_chunks(g, bottom, on_device) if coverage.needs_predecessor(g) else range(0)
        for g in layout.groups
    ]


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
    if not candidates:
        return Availability(on_device, on_device, on_device), [w.keys for w in walks]
    for w in walks:
        top = coverage.load_chunks(w.group, candidates[0], on_device)
        bottom = coverage.load_chunks(w.group, candidates[-1], on_device)
        if top or bottom:
            ends = [r for r in (top, bottom) if r]
            w.classify(range(min(r.start for r in ends), max(r.stop for r in ends)),
                       chain, states, loading_elsewhere)
    best = [on_device, on_device, on_device]
    settled = [False, False, False]
    for w, chunks in zip(walks, common_chunks(layout, candidates, on_device), strict=True):
        for which in range(3):
            settled[which] = settled[which] or w.any_bad(which, chunks)
    for b in candidates:
        if all(settled):
            break
        ok = [True, True, True]
        for w in walks:
            chunks = coverage.load_chunks(w.group, b, on_device)
            if chunks:
                w.classify(chunks, chain, states, loading_elsewhere)
                for which in range(3):
                    ok[which] = ok[which] and not w.any_bad(which, chunks)
        for which in range(3):
            if ok[which] and not settled[which]:
                best[which], settled[which] = b, True
    return Availability(*best), [w.keys for w in walks]


_READY, _PINNED, _WRITING = ChunkState.READY, ChunkState.PINNED, ChunkState.WRITING


class _GroupWalk:
    """One group's chunks classified so far, as the candidates are walked downwards.

    Every chunk is classified once. Load ranges only move left as the boundary shrinks
    (both ends of ``required`` never decrease as ``b`` grows), so a range that does is
    checked against the previous one in O(1); any other is checked chunk by chunk.
    ``bad[k]`` holds, sorted, the chunks that fail kind ``k`` (0 ready, 1 readable, 2 soon;
    see ``Availability``). Example: sliding window 128 in 64-token chunks, candidates 640
    then 576: chunks 8-9, then only chunk 7.
    """

    def __init__(self, gi: int, group: Group) -> None:
        self.gi, self.group = gi, group
        self.keys: dict[int, ChunkKey] = {}
        self.bad: tuple[list[int], list[int], list[int]] = ([], [], [])
        self._last = range(0)

    def classify(
        self, chunks: range, chain: KeyChain,
        states: Callable[[list[ChunkKey]], list[ChunkState]],
        loading_elsewhere: Callable[[ChunkKey], bool] | None,
    ) -> None:
        """Classify the chunks of ``chunks`` not seen yet (one batched store lookup)."""
        last, self._last = self._last, chunks
        if last and chunks.start <= last.start and chunks.stop <= last.stop:
            chunks = range(chunks.start, min(chunks.stop, last.start))  # the rest is seen
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
            if not (ok or other or st is _WRITING):
                insort(soon, c)

    def any_bad(self, which: int, chunks: range) -> bool:
        """Whether a chunk of ``chunks`` (all classified) fails kind ``which``."""
        bad = self.bad[which]
        i = bisect_left(bad, chunks.start)
        return i < len(bad) and bad[i] < chunks.stop
