"""Choosing the hit: the largest admissible boundary whose chunks are all available.

A lookup never assumes which boundaries a producer served (DESIGN section 3): it walks the
candidate hits (``coverage.consumer_hits``: the boundaries, the whole-prompt one restoring a
token less) from the largest down, classifies each chunk the first time a
candidate needs it (one batched store lookup per group and candidate that brings new
chunks into view), and stops at the first candidate whose chunks are all ready. Before
that, the chunks every candidate needs are looked up alone: a new prompt lacks its first
chunks, and is a miss after one small store lookup. A prompt stored whole is found by
``ready_at`` before any of this; a 131k-token prompt costs O(chunks + boundaries x log
chunks).
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from kvtier import coverage
from kvtier.coverage import ChunkRanges
from kvtier.keys import ChunkKey, KeyChain
from kvtier.layout import Group, Layout
from kvtier.retention import consumer_hits_between
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


class LoadRanges:
    """``coverage.load_chunks`` per (group index, boundary, tokens on device), remembered:
    a planner's lookups ask for the same few boundaries of every request, many times each
    (``ready_at``, the walk of ``assess``, the hit's keys and chunks). Bounded: forgotten
    all at once when full. Not locked: the planner calls it under its lock."""

    LIMIT = 1 << 16

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._groups = layout.groups
        self._known: dict[tuple[int, int, int], range] = {}
        self.prefix_first = sorted(range(len(layout.groups)),
                                   key=lambda gi: not coverage.needs_predecessor(layout.groups[gi]))
        """The group indices, those whose chunks need their predecessors (full attention)
        first: the order a walk down the candidates looks at them in."""

    def __call__(self, gi: int, b: int, on_device: int) -> range:
        key = (gi, b, on_device)
        found = self._known.get(key)
        if found is None:
            found = coverage.load_chunks(self._groups[gi], b, on_device)
            if len(self._known) >= self.LIMIT:
                self._known.clear()
            self._known[key] = found
        return found


def _of(layout: Layout, ranges: LoadRanges | None) -> LoadRanges:
    return ranges if ranges is not None and ranges.layout is layout else LoadRanges(layout)


def candidate_hits(
    layout: Layout, num_tokens: int, on_device: int, max_load_tokens: int | None,
) -> list[int]:
    """The hits a consumer knowing ``num_tokens`` tokens may take past ``on_device`` (and
    within ``max_load_tokens`` of it), largest first: ``coverage.consumer_hits``. Example:
    granularity 64, 256 tokens, nothing on device: [255, 192, 128, 64]."""
    top = None if max_load_tokens is None else on_device + max_load_tokens
    return consumer_hits_between(layout, num_tokens, on_device, top)[::-1]


def ready_at(
    layout: Layout,
    chain: KeyChain,
    b: int,
    on_device: int,
    states: Callable[[list[ChunkKey]], list[ChunkState]],
    loading_elsewhere: Callable[[ChunkKey], bool] | None,
    load_ranges: LoadRanges | None = None,
) -> list[list[ChunkKey]] | None:
    """The fast path: per group, the key of each chunk a hit at ``b`` (a candidate hit)
    loads (in chunk order), if every one is ready (the common case of a prompt stored
    whole), else None. Each group's last chunk is looked up first: a partial hit or a new
    prompt lacks it."""
    load = _of(layout, load_ranges)
    ranges = [load(gi, b, on_device) for gi in range(len(layout.groups))]
    lasts = [chain.keys(gi, r[-1:]) for gi, r in enumerate(ranges)]
    if _ABSENT in states([*itertools.chain.from_iterable(lasts)]):
        return None
    keys = [chain.keys(gi, r) for gi, r in enumerate(ranges)]
    flat = keys[0] if len(keys) == 1 else [*itertools.chain.from_iterable(keys)]
    if loading_elsewhere is not None and any(map(loading_elsewhere, flat)):
        return None
    found = states(flat)
    if _ABSENT in found or _WRITING in found:  # C-speed identity scans
        return None
    return keys


def hit_keys(layout: Layout, chain: KeyChain, b: int, on_device: int,
             load_ranges: LoadRanges | None = None) -> list[list[ChunkKey]]:
    """Per group, the key of each chunk a hit at ``b`` loads, in chunk order."""
    load = _of(layout, load_ranges)
    return [chain.keys(gi, load(gi, b, on_device)) for gi in range(len(layout.groups))]


def common_chunks(layout: Layout, candidates: Sequence[int], on_device: int,
                  load_ranges: LoadRanges | None = None) -> list[range]:
    """Per group, chunks every candidate boundary loads (``candidates`` largest first).

    For groups where a chunk is needed only with its predecessor (full attention), load
    ranges are prefixes past ``on_device`` that only grow with the boundary: the chunks
    common to all candidates are the smallest candidate's. If one of them can never be
    had, no candidate can, and the lookup is a miss at once. Other groups answer an empty
    range (their ranges may be empty at some boundaries: chunked local attention).
    Example: full attention, 16-token chunks, candidates 64..16, nothing on device: chunk 0.
    """
    bottom, load = candidates[-1], _of(layout, load_ranges)
    return [_common(g, load(gi, bottom, on_device)) for gi, g in enumerate(layout.groups)]


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
    load_ranges: LoadRanges | None = None,
) -> Availability:
    """Classify the chunks the candidates need and find the best boundary of each kind.

    First classifies, per group, the chunks every candidate needs (``common_chunks``): a
    kind that fails on one is settled at ``on_device`` at once, and when every kind is (a
    chunk absent), nothing else is looked up. Then classifies the largest candidate's
    chunks (one batched store lookup per group) and walks ``candidates`` (largest first)
    until every kind is settled: the first candidate whose chunks all pass a kind is that
    kind's best. A candidate's groups are classified only while a kind still open can pass
    there, groups whose chunks need their predecessors first (a window's chunks are not
    looked up for a candidate whose full-attention chunks already fail).
    """
    load = _of(layout, load_ranges)
    walks = [_GroupWalk(gi, g) for gi, g in enumerate(layout.groups)]
    best = [on_device, on_device, on_device]
    if not candidates:
        return Availability(*best)
    settled = [False, False, False]
    for w, common in zip(walks, common_chunks(layout, candidates, on_device, load),
                         strict=True):
        w.classify(common, chain, states, loading_elsewhere)
        settled = [was or fail for was, fail in zip(settled, w.fails(common), strict=True)]
    # past the largest candidate, a predecessor group's chunks are all classified already
    walks.sort(key=lambda w: not coverage.needs_predecessor(w.group))
    for b in candidates:
        if all(settled):
            break
        ok = [True, True, True]
        for w in walks:
            if not ((ok[0] and not settled[0]) or (ok[1] and not settled[1])
                    or (ok[2] and not settled[2])):
                break  # no kind left open can pass at ``b``: the rest cannot change that
            chunks = load(w.gi, b, on_device)
            w.classify(chunks, chain, states, loading_elsewhere)
            ok = [good and not fail for good, fail in zip(ok, w.fails(chunks), strict=True)]
        for which in range(3):
            if ok[which] and not settled[which]:
                best[which], settled[which] = b, True
    return Availability(*best)


def assess_at_once(
    layout: Layout,
    chain: KeyChain,
    candidates: Sequence[int],
    on_device: int,
    states: Callable[[list[ChunkKey]], list[ChunkState]],
    loading_elsewhere: Callable[[ChunkKey], bool] | None,
    load_ranges: LoadRanges | None = None,
) -> Availability:
    """``assess`` for a store whose ``lookup`` changes nothing (a ``ChunkStore``: looking up
    a chunk ``assess`` would skip costs a dictionary probe and promotes nothing), with fewer
    store lookups: each group's chunks are classified in spans (``_Levels``) that start as
    the largest candidate's chunks and at least double when a candidate needs more, so a
    window's chunks take a few store lookups where ``assess`` makes one per candidate (and
    ``ready_at`` two before it). The same answer as ``assess``; where the largest candidate
    is all ready (``ready_at``'s case), one store lookup per group. Example: full attention,
    16-token chunks, candidates 64..16, chunks 0-2 ready and 3 absent: one lookup of chunks
    0-3, then 64 fails every kind and 48 passes every kind."""
    load = _of(layout, load_ranges)
    best = [on_device, on_device, on_device]
    if not candidates:
        return Availability(*best)
    # groups whose chunks need their predecessors first (a window's chunks are not looked
    # up for a candidate whose full-attention chunks already fail); then the group that
    # failed the last candidate first: the next one usually fails there too (a window
    # stored for none of the prompt's boundaries fails every candidate)
    groups = [_Levels(gi, chain, states, loading_elsewhere) for gi in load.prefix_first]
    # a candidate of level L passes kinds L..2, so the kinds settled are always m..2, m the
    # lowest level seen so far: a candidate below it settles kinds L..m-1
    settled_from = 3
    for b in candidates:
        level = 0
        for g in groups:
            r = load(g.gi, b, on_device)
            if r:
                level = max(level, g.level(r))
                if level >= settled_from:  # this candidate can settle no kind
                    if g is not groups[0]:
                        groups.remove(g)
                        groups.insert(0, g)
                    break
        if level < settled_from:
            best[level:settled_from] = [b] * (settled_from - level)
            settled_from = level
            if not level:
                break
    return Availability(*best)


class _Levels:
    """One group's chunks classified so far, for ``assess_at_once``: the level of each chunk
    ``lo .. hi - 1`` (0 ready, so it passes every kind of ``Availability``; 1 readable but
    being loaded by another request; 2 soon only: being written, or absent while another
    request loads it; 3 none: absent). A span grows to cover what a candidate needs, to at
    least twice its size, so that walking down a window's candidates takes a few store
    lookups, not one per candidate, and at most twice the chunks the walk reads."""

    def __init__(self, gi: int, chain: KeyChain,
                 states: Callable[[list[ChunkKey]], list[ChunkState]],
                 loading_elsewhere: Callable[[ChunkKey], bool] | None) -> None:
        self.gi, self._chain, self._states = gi, chain, states
        self._elsewhere = loading_elsewhere
        self.lo = self.hi = 0
        self._levels: list[int] = []

    def level(self, chunks: range) -> int:
        """The highest level among ``chunks`` (not empty), classifying those not seen yet."""
        lo = self.lo
        if chunks.start < lo or chunks.stop > self.hi:
            self._grow(chunks)
            lo = self.lo
        return max(self._levels[chunks.start - lo : chunks.stop - lo])

    def _grow(self, chunks: range) -> None:
        if self.hi == self.lo:  # nothing classified yet: exactly these chunks
            self.lo, self.hi, self._levels = chunks.start, chunks.stop, self._classify(chunks)
            return
        size = self.hi - self.lo
        if chunks.start < self.lo:
            lo = max(0, min(chunks.start, self.lo - size))
            self._levels[:0] = self._classify(range(lo, self.lo))
            self.lo = lo
        if chunks.stop > self.hi:  # past the largest candidate's chunks: not in a walk down
            hi = chunks.stop
            self._levels += self._classify(range(self.hi, hi))
            self.hi = hi

    def _classify(self, chunks: range) -> list[int]:
        keys = self._chain.keys(self.gi, chunks)
        found = self._states(keys)
        elsewhere = self._elsewhere
        if elsewhere is not None and not any(map(elsewhere, keys)):
            elsewhere = None
        if _ABSENT not in found and _WRITING not in found and elsewhere is None:  # C speed
            return [0] * len(found)
        levels = [0 if st is _READY or st is _PINNED else 2 if st is _WRITING else 3
                  for st in found]
        if elsewhere is not None:
            for i, k in enumerate(keys):
                if elsewhere(k):
                    levels[i] = _ELSEWHERE[levels[i]]
        return levels


_ELSEWHERE: Final = (1, 1, 2, 2)
"""A chunk's level (``_Levels``) when another request loads it, by its level otherwise."""


_READY: Final = ChunkState.READY
_PINNED: Final = ChunkState.PINNED
_ABSENT: Final = ChunkState.ABSENT
_WRITING: Final = ChunkState.WRITING


class _GroupWalk:
    """One group's chunks classified so far, as the candidates are walked downwards.

    Every chunk is classified once. ``_seen`` is a range of chunks all classified (grown
    while the classified ranges touch), so that a candidate inside it answers in O(1).
    ``bad[k]`` holds, sorted, the chunks that fail kind ``k`` (0 ready, 1 readable, 2
    soon; see ``Availability``). Example: full attention, candidates 640 down to 64 in
    64-token chunks: chunk 0 (common to all), then chunks 0-9 for 640, one lookup each;
    every smaller candidate's chunks are then inside ``_seen``.
    """

    def __init__(self, gi: int, group: Group) -> None:
        self.gi, self.group = gi, group
        self._apart: set[int] = set()  # chunks classified outside ``_seen``
        self.bad: tuple[list[int], list[int], list[int]] = ([], [], [])
        self._seen = range(0)

    def classify(
        self, chunks: range, chain: KeyChain,
        states: Callable[[list[ChunkKey]], list[ChunkState]],
        loading_elsewhere: Callable[[ChunkKey], bool] | None,
    ) -> None:
        """Classify the chunks of ``chunks`` not seen yet (one batched store lookup)."""
        seen = self._seen
        if not chunks or (seen.start <= chunks.start and chunks.stop <= seen.stop):
            return
        if not seen:
            self._seen = chunks
            self._classify(chunks, chain, states, loading_elsewhere)
        elif chunks.start <= seen.stop and seen.start <= chunks.stop:  # they touch
            self._seen = range(min(seen.start, chunks.start), max(seen.stop, chunks.stop))
            for part in (range(chunks.start, seen.start), range(seen.stop, chunks.stop)):
                self._classify(part, chain, states, loading_elsewhere)
        else:
            todo = [c for c in chunks if c not in self._apart]
            self._apart.update(todo)
            self._classify(todo, chain, states, loading_elsewhere)

    def _classify(
        self, todo: Sequence[int], chain: KeyChain,
        states: Callable[[list[ChunkKey]], list[ChunkState]],
        loading_elsewhere: Callable[[ChunkKey], bool] | None,
    ) -> None:
        if not todo:
            return
        ks = chain.keys(self.gi, todo)
        found = states(ks)
        if (_ABSENT not in found and _WRITING not in found  # all readable: C-speed scans
                and (loading_elsewhere is None or not any(map(loading_elsewhere, ks)))):
            return
        ready, readable, soon = self.bad
        for c, k, st in zip(todo, ks, found, strict=True):
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


_PASS: Final = (False, False, False)
_NOT_READY: Final = (True, False, False)


def _any_in(sorted_chunks: list[int], chunks: range) -> bool:
    i = bisect_left(sorted_chunks, chunks.start)
    return i < len(sorted_chunks) and sorted_chunks[i] < chunks.stop


def hit_chunks(layout: Layout, b: int, on_device: int,
               load_ranges: LoadRanges | None = None) -> tuple[ChunkRanges, ...]:
    """Per group, the chunks a hit at ``b`` loads (``coverage.load_chunks``) as ranges;
    with 16-token chunks of full attention, ``b = 64`` and ``on_device = 16``: chunks
    1..3."""
    load = _of(layout, load_ranges)
    return tuple(
        ChunkRanges.of([(r.start, r.stop)]) if (r := load(gi, b, on_device)) else ChunkRanges()
        for gi in range(len(layout.groups))
    )
