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


def needed_chunks(layout: Layout, candidates: Sequence[int], on_device: int) -> list[ChunkRanges]:
    """Per group, every chunk some candidate boundary would load."""
    return [
        ChunkRanges.of(
            (r.start, r.stop) for b in candidates if (r := coverage.load_chunks(g, b, on_device))
        )
        for g in layout.groups
    ]


def assess(
    layout: Layout,
    chain: KeyChain,
    candidates: Sequence[int],
    on_device: int,
    states: Callable[[list[ChunkKey]], list[ChunkState]],
    loading_elsewhere: Callable[[ChunkKey], bool],
) -> tuple[Availability, list[dict[int, ChunkKey]]]:
    """Classify every needed chunk and find the best boundary of each kind.

    Returns the availability and, per group, the key of every needed chunk.
    """
    needed = needed_chunks(layout, candidates, on_device)
    keys: list[dict[int, ChunkKey]] = []
    flags: list[tuple[list[int], ...]] = []
    for gi, chunks in enumerate(needed):
        idx = list(chunks)
        ks = chain.keys(gi, idx)
        keys.append(dict(zip(idx, ks, strict=True)))
        top = (idx[-1] + 1) if idx else 0
        ready, readable, soon = [0] * top, [0] * top, [0] * top
        for c, k, st in zip(idx, ks, states(ks), strict=True):
            other = loading_elsewhere(k)
            readable[c] = int(st.readable)
            ready[c] = int(st.readable and not other)
            soon[c] = int(st.readable or st is ChunkState.WRITING or other)
        flags.append((_prefix(ready), _prefix(readable), _prefix(soon)))
    best = [_best(layout, candidates, on_device, flags, i) for i in range(3)]
    return Availability(*best), keys


def _prefix(flags: list[int]) -> list[int]:
    return [0, *accumulate(flags)]


def _best(
    layout: Layout,
    candidates: Sequence[int],
    on_device: int,
    flags: list[tuple[list[int], ...]],
    which: int,
) -> int:
    for b in candidates:
        if all(
            _all_set(flags[gi][which], coverage.load_chunks(g, b, on_device))
            for gi, g in enumerate(layout.groups)
        ):
            return b
    return on_device


def _all_set(prefix: list[int], chunks: range) -> bool:
    if not chunks:
        return True
    return prefix[chunks.stop] - prefix[chunks.start] == len(chunks)
