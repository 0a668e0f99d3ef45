"""Choosing the hit: the largest admissible boundary whose chunks are all available.

A lookup never assumes which boundaries a producer served (DESIGN section 3): it gathers
the state of every chunk any candidate boundary would load, in one batched store lookup,
then walks the candidates from the largest down with prefix sums, so that a 131k-token
prompt costs O(chunks + boundaries), not O(chunks x boundaries).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from kvtier import coverage
from kvtier.coverage import ChunkRanges
from kvtier.keys import ChunkKey, KeyChain
from kvtier.layout import Layout
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


def _load_ranges(layout: Layout, candidates: Sequence[int], on_device: int) -> list[list[range]]:
    """``coverage.load_chunks`` of every group, per candidate boundary."""
    return [[coverage.load_chunks(g, b, on_device) for g in layout.groups] for b in candidates]


def assess(
    layout: Layout,
    chain: KeyChain,
    candidates: Sequence[int],
    on_device: int,
    states: Callable[[list[ChunkKey]], list[ChunkState]],
    loading_elsewhere: Callable[[ChunkKey], bool] | None,
) -> tuple[Availability, list[dict[int, ChunkKey]]]:
    """Classify every needed chunk and find the best boundary of each kind.

    Returns the availability and, per group, the key of every needed chunk.
    """
    per_b = _load_ranges(layout, candidates, on_device)
    keys: list[dict[int, ChunkKey]] = []
    flags: list[tuple[list[int], ...]] = []
    for gi in range(len(layout.groups)):
        idx = list(ChunkRanges.of((r.start, r.stop) for rs in per_b if (r := rs[gi])))
        ks = chain.keys(gi, idx)
        keys.append(dict(zip(idx, ks, strict=True)))
        flags.append(_classify(idx, ks, states(ks), loading_elsewhere))
    best = [_best(candidates, per_b, flags, which, on_device) for which in range(3)]
    return Availability(*best), keys


_READY, _PINNED, _WRITING = ChunkState.READY, ChunkState.PINNED, ChunkState.WRITING


def _classify(
    idx: list[int], ks: list[ChunkKey], found: list[ChunkState],
    loading_elsewhere: Callable[[ChunkKey], bool] | None,
) -> tuple[list[int], ...]:
    """Prefix sums of (ready, readable, soon) flags over chunk indices."""
    top = (idx[-1] + 1) if idx else 0
    ready, readable, soon = [0] * top, [0] * top, [0] * top
    for c, k, st in zip(idx, ks, found, strict=True):
        other = loading_elsewhere is not None and loading_elsewhere(k)
        ok = st is _READY or st is _PINNED
        readable[c] = ok
        ready[c] = ok and not other
        soon[c] = ok or other or st is _WRITING
    return _prefix(ready), _prefix(readable), _prefix(soon)


def _prefix(flags: list[int]) -> list[int]:
    return [0, *accumulate(flags)]


def _best(
    candidates: Sequence[int], per_b: list[list[range]], flags: list[tuple[list[int], ...]],
    which: int, on_device: int,
) -> int:
    for b, ranges in zip(candidates, per_b, strict=True):
        if all(_all_set(flags[gi][which], r) for gi, r in enumerate(ranges)):
            return b
    return on_device


def _all_set(prefix: list[int], chunks: range) -> bool:
    if not chunks:
        return True
    return prefix[chunks.stop] - prefix[chunks.start] == len(chunks)
