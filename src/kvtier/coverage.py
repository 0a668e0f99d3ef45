"""The coverage contract: what a hit needs, what a producer stores, what a consumer loads.

Everything kvtier decides about a request comes from two definitions (DESIGN section 3):

* ``retained(group, b)``: the token interval whose KV the engine keeps to compute position
  ``b`` and beyond;
* the admissible boundaries: positive multiples of the hit granularity ``G`` with
  ``b + d_max <= num_tokens`` (``d_max`` the largest lookahead of a draft group whose tail
  is stored), and for a consumer also ``b <= num_prompt_tokens - 1``, or
  ``b <= num_prompt_tokens`` where the layout allows a whole-prompt hit.

A whole-prompt hit serves a consumer whose known tokens ``N`` end on a boundary (an exact
repeat of a prompt, a resumed request): its hit at boundary ``N`` restores what a hit at
``N - 1`` would, ``retained(g, N - 1)`` of every group, and the engine computes token
``N - 1`` again for its logits (``consumer_hit``). Every chunk that needs ends by ``N``, so
its keys cover the consumer's own tokens. A state group allows it only when it stores the
state after token ``N - 2``, that is with one-token chunks (it keeps a state per chunk
end); a stored draft tail never does (its chunks need tokens past ``N``). A producer
serving a boundary ``b`` therefore stores for both hits ``b - 1`` and ``b``
(``hits_served``). Example: full attention, 64-token chunks, a 256-token prompt repeated:
the hit restores tokens ``[0, 255)`` from chunks 0-3 and the engine computes token 255.

A draft group whose tail is *recomputed* restores, at ``b``, only up to its restore point
``restore_point(group, b)``: the last chunk end ``e`` with ``e + d <= b``, so that every key
a hit uses covers tokens before ``b`` only. The engine recomputes the draft KV of
``[restore_point, b)`` from target hidden states stored with the boundary (a ``state``
group). Example: MTP module 2 (``d = 2``), 16-token chunks, a 65-token prompt: the hit is
64 and module 2 restores ``[0, 48)`` (chunks 0-2, keyed by tokens ``[0, 50)`` at most);
with a stored tail the hit would have to be 48, since chunk 3 is keyed by ``[0, 66)``.

A producer serves a subset of the admissible boundaries (every one by default: dense;
``kvtier.boundaries`` picks fewer). ``required``, ``store_set``, ``store_delta``,
``serve_delta`` and ``load_set`` are derived from those two and the served set, nothing
else. No other module computes a window in chunks, a store mask or a load range:
callers ask here (the two definitions and the value types live in ``kvtier.retention``
and are re-exported here). Every function is pure: plain data in, plain data out.

Chunk ``c`` of a group with ``T`` tokens per chunk covers tokens ``[c*T, (c+1)*T)``.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence

from kvtier.layout import Group, Layout
from kvtier.retention import (
    BlockRun,
    ChunkRanges,
    Span,
    admissible_boundaries,
    consumer_hit,
    consumer_hits,
    hits_served,
    restore_point,
    restored,
    retained,
    whole_prompt_hit,
)

__all__ = [
    "BlockRun",
    "ChunkRanges",
    "Span",
    "admissible_boundaries",
    "blocks_per_slot",
    "check_served",
    "consumer_hit",
    "consumer_hits",
    "dense_chunks",
    "dense_delta",
    "first_boundary",
    "hits_served",
    "load_chunks",
    "load_set",
    "needs_predecessor",
    "required",
    "restore_point",
    "restored",
    "restored_blocks",
    "retained",
    "retained_blocks",
    "serve_delta",
    "served_chunks",
    "slot_block",
    "store_blocks",
    "store_delta",
    "store_horizon",
    "store_set",
    "store_sets",
    "stores_whole_chunks",
    "whole_prompt_hit",
]


# --------------------------------------------------------------------------------------
# Derived: required, store, load


def _chunks_of_span(group: Group, span: Span) -> range:
    t = group.tokens_per_chunk
    if span.empty:
        return range(0)
    return range(span.start // t, -(-span.end // t))


def required(group: Group, b: int) -> range:
    """Chunks of ``group`` that intersect ``restored(group, b)``: what a hit at ``b`` needs.

    Example: sliding window 32, ``E = 3``, 16-token chunks, ``b = 64``: chunks 1, 2, 3.
    """
    return _chunks_of_span(group, restored(group, b))


def retained_blocks(group: Group, b: int) -> range:
    """Blocks the engine's allocator keeps at boundary (or position) ``b``.

    Example: sliding window 32, ``E = 3``, 4-token blocks, ``b = 64``: blocks 7..15
    (tokens 28..63, the first of which holds retained token 30).
    """
    span = retained(group, b)
    t = group.tokens_per_block
    if span.empty:
        return range(0)
    return range(span.start // t, -(-span.end // t))


def restored_blocks(group: Group, b: int) -> range:
    """Blocks the engine allocates at admission for a hit at ``b``: those of the restore.

    ``retained_blocks(group, restore_point(group, b))``; the engine allocates the blocks of
    a recomputed draft tail as it computes them. Example: lookahead 2, recomputed, 4-token
    blocks in 16-token chunks, ``b = 64``: blocks 0..11.
    """
    return retained_blocks(group, restore_point(group, b))


def store_set(
    layout: Layout, group_index: int, horizon: int, served: Sequence[int] | None = None
) -> ChunkRanges:
    """Chunks of one group a producer that has computed ``horizon`` tokens stores.

    The union of ``required(group, b)`` over the boundaries the producer serves up to the
    horizon: ``served`` (ascending, each one admissible; those past the horizon are
    ignored), or every admissible ``b`` when ``served`` is None (dense, computed once per
    layout, group and boundary count). Cost grows with boundaries, never with tokens.

    Example: full attention with 16-token chunks plus sliding window 8 with 4-token chunks,
    33 tokens: full chunks 0-1, sliding chunks 2-3 and 6-7; serving only 32: full chunks
    0-1, sliding chunks 6-7.
    """
    if served is None:  # dense: one answer per count of boundaries passed, kept
        return _dense_store_set(layout, group_index, len(admissible_boundaries(layout, horizon)))
    return _union_served(layout, group_index, _served(layout, horizon, served))


def _union_served(layout: Layout, gi: int, served: Sequence[int]) -> ChunkRanges:
    return ChunkRanges.of((r.start, r.stop) for b in served if (r := served_chunks(layout, gi, b)))


@functools.lru_cache(maxsize=4096)
def _dense_store_set(layout: Layout, group_index: int, num_bounds: int) -> ChunkRanges:
    """``store_set`` past the first ``num_bounds`` boundaries, dense: every request of a
    layout asks for the same few, so each is computed once."""
    g = layout.hit_granularity
    return _union_served(layout, group_index, range(g, g * num_bounds + 1, g))


@functools.lru_cache(maxsize=65536)
def served_chunks(layout: Layout, group_index: int, b: int) -> range:
    """Chunks of one group a producer serving boundary ``b`` stores: ``required`` of every
    hit of ``hits_served``. One range: the hits' required ranges overlap or touch.

    Example: chunked local ``C = 256``, 64-token chunks: ``b = 256`` -> chunks 0-3 (the
    whole-prompt hit at 255; the hit at 256 keeps nothing); ``b = 320`` -> chunk 4."""
    group = layout.groups[group_index]
    lo, hi = 0, 0
    for h in hits_served(layout, b):
        r = required(group, h)
        if r:
            lo, hi = (r.start, r.stop) if lo == hi else (min(lo, r.start), max(hi, r.stop))
    return range(lo, hi)


def _served(layout: Layout, horizon: int, served: Sequence[int] | None) -> Sequence[int]:
    """The served boundaries admissible at ``horizon``; every admissible one when None."""
    bounds = admissible_boundaries(layout, horizon)
    if served is None:
        return bounds
    check_served(layout, served)
    return served[: bisect.bisect_right(served, bounds[-1] if bounds else 0)]


def check_served(layout: Layout, served: Sequence[int]) -> None:
    """``ValueError`` unless ``served`` ascends strictly through multiples of the hit
    granularity: the only boundaries any producer may serve. Example: granularity 16:
    ``(16, 48)`` passes, ``(48, 16)`` and ``(24,)`` do not."""
    g = layout.hit_granularity
    prev = 0
    for b in served:
        if b <= prev or b % g:
            raise ValueError(
                f"served boundaries must ascend through positive multiples of the hit "
                f"granularity {g}; got {list(served)[:8]}"
            )
        prev = b


def store_sets(layout: Layout, horizon: int) -> tuple[ChunkRanges, ...]:
    """``store_set`` of every group, group outermost."""
    return tuple(store_set(layout, i, horizon) for i in range(len(layout.groups)))


def store_delta(
    layout: Layout, group_index: int, old_horizon: int, new_horizon: int
) -> ChunkRanges:
    """``store_set(new_horizon) - store_set(old_horizon)``, without recomputing either.

    A dense producer's, after each step (``dense_delta``: by counts of boundaries passed)."""
    if new_horizon < old_horizon:
        raise ValueError(f"horizon went backwards: {old_horizon} -> {new_horizon}")
    return dense_delta(layout, group_index, len(admissible_boundaries(layout, old_horizon)),
                       len(admissible_boundaries(layout, new_horizon)))


@functools.lru_cache(maxsize=4096)
def dense_delta(layout: Layout, group_index: int, old: int, new: int) -> ChunkRanges:
    """``store_delta`` from the first ``old`` admissible boundaries to the first ``new``."""
    g = layout.hit_granularity
    bounds = range(g, g * new + 1, g)
    return serve_delta(layout, group_index, bounds[:old], bounds[old:])


def serve_delta(
    layout: Layout, group_index: int, served: Sequence[int], new: Sequence[int]
) -> ChunkRanges:
    """Chunks a producer that serves ``served`` adds by also serving ``new``.

    ``store_set(.., served + new) - store_set(.., served)``; every boundary of ``new``
    lies past the last of ``served`` (a producer's served set only grows at its end).
    Both ends of ``required(group, b)`` never decrease as ``b`` grows, so the part of the
    old set that can overlap the new chunks is found by walking ``served`` backwards until
    a boundary reaches below the new chunks. Example: sliding window 16 in 16-token chunks,
    served ``(64,)`` (chunk 3), new ``(96,)``: chunk 5.
    """
    check_served(layout, [*served[-1:], *new])
    if layout.groups[group_index].kind == "full":  # nested prefixes [0, e): the last holds all
        new = new[-1:]
    fresh_set = ChunkRanges.of(
        (r.start, r.stop) for b in new if (r := served_chunks(layout, group_index, b)))
    if not fresh_set:
        return fresh_set
    low = fresh_set.ranges[0][0]
    overlap: list[tuple[int, int]] = []
    for b in reversed(served):
        r = served_chunks(layout, group_index, b)
        if not r:
            continue
        if r.stop <= low:
            break
        overlap.append((r.start, r.stop))
        if r.start <= low:
            break
    return fresh_set.minus(ChunkRanges.of(overlap))


def load_chunks(group: Group, b: int, on_device: int = 0) -> range:
    """The chunks ``load_set`` touches, as one range: cheap enough to ask for every boundary.

    Example: sliding window 32, ``E = 3``, 4-token blocks in 16-token chunks, ``b = 64``,
    40 tokens on device: chunks 2 and 3.
    """
    if on_device % group.tokens_per_block:
        raise ValueError(
            f"on_device must be a multiple of tokens_per_block {group.tokens_per_block}, "
            f"got {on_device}"
        )
    # required(group, b) and restored_blocks(group, b), from the one span they share
    span = restored(group, b)
    if span.empty:
        return range(0)
    tb = group.tokens_per_block
    first_block = max(span.start // tb, on_device // tb)
    if first_block >= -(-span.end // tb):  # every kept block is on the device already
        return range(0)
    return range(first_block // group.blocks_per_chunk, -(-span.end // group.tokens_per_chunk))


def load_set(group: Group, b: int, on_device: int = 0) -> tuple[BlockRun, ...]:
    """Blocks to load for a hit at ``b``: ``required(group, b)`` minus what the engine has.

    ``on_device`` is the number of leading tokens whose KV the engine already holds (its own
    prefix-cache hit, a multiple of ``tokens_per_block``); it keeps ``retained(group,
    on_device)`` of them, and since retained spans only move right as the boundary grows,
    every block of ``retained(group, b)`` below ``on_device`` is among those it keeps.
    Within a chunk, only blocks the engine's allocator keeps (``retained_blocks``) are
    written; others hold no live KV.

    Example: sliding window 32, ``E = 3``, 4-token blocks in 16-token chunks, ``b = 64``,
    nothing on device: chunk 1 block 3 only (absolute block 7), then chunks 2 and 3 whole.
    """
    keep = restored_blocks(group, b)
    first_block = max(keep.start, on_device // group.tokens_per_block)
    bpc = group.blocks_per_chunk
    runs = []
    for chunk in load_chunks(group, b, on_device):
        lo = max(first_block, chunk * bpc)
        hi = min(keep.stop, (chunk + 1) * bpc)
        runs.append(BlockRun(chunk, lo - chunk * bpc, hi - lo))
    return tuple(runs)


def store_blocks(layout: Layout, group_index: int, chunk: int) -> BlockRun:
    """The blocks of ``chunk`` a stored copy must hold: every block some hit may load.

    Retained spans only move right as the boundary grows, so the first hit that needs the
    chunk (of the first admissible boundary at or past its end: ``hits_served``) needs the
    most of it. Blocks before that are dead for every hit (an engine may already have freed
    them) and are not copied.

    Example: sliding window 8, 4-token blocks in 16-token chunks, granularity 64: chunk 3
    (tokens 48..63) is needed only by the hit at 64, which keeps tokens 57..63: blocks 2
    and 3 of the chunk. A state chunk holds one block: the state after its last token.
    """
    group = layout.groups[group_index]
    bpc = group.blocks_per_chunk
    if stores_whole_chunks(group):
        return BlockRun(chunk, 0, bpc)
    lo = chunk * bpc
    for h in hits_served(layout, first_boundary(layout, group_index, chunk)):
        if chunk in required(group, h):
            lo = max(lo, restored_blocks(group, h).start)
            break
    return BlockRun(chunk, lo - chunk * bpc, bpc - (lo - chunk * bpc))


def blocks_per_slot(group: Group) -> int:
    """Blocks one slot of ``group`` holds: a chunk's blocks, except for a state group, whose
    chunk keeps one block (the state after its last token, ``store_blocks``).
    Example: 4 blocks per chunk -> 4, or 1 for a state group."""
    return 1 if group.kind == "state" else group.blocks_per_chunk


def slot_block(group: Group, run: BlockRun) -> int:
    """Where ``run``'s first block sits in its chunk's slot (see ``blocks_per_slot``).

    Example: 4 blocks per chunk, ``BlockRun(chunk=1, first_block=2, num_blocks=2)`` -> 2;
    in a state group only the chunk's last block is kept: ``BlockRun(1, 3, 1)`` -> 0, and
    any other run is a ``ValueError``.
    """
    if blocks_per_slot(group) == group.blocks_per_chunk:
        return run.first_block
    if run.num_blocks != 1 or run.first_block != group.blocks_per_chunk - 1:
        raise ValueError(f"a state chunk holds only its last block, at slot block 0; got {run}")
    return 0


def stores_whole_chunks(group: Group) -> bool:
    """Whether ``store_blocks`` holds every block of every chunk of ``group``: true when
    retained spans start at token 0 (full attention), so no block of a chunk is ever dead.
    Example: full attention -> True; sliding window 128 -> False."""
    return group.kind == "full"


def needs_predecessor(group: Group) -> bool:
    """Whether every hit that needs a chunk of ``group`` also needs the chunk before it.

    True when retained spans always start at token 0 (full attention): chunk ``c`` is
    useless once chunk ``c - 1`` is gone, so a prefix-aware eviction policy may evict it
    first. Example: full attention -> True; sliding window 128 -> False.
    """
    return group.kind == "full"


def first_boundary(layout: Layout, group_index: int, chunk: int) -> int:
    """The first boundary whose hit can need ``chunk``: the first multiple of the hit
    granularity at or past the chunk's end (for a recomputed draft tail, past its end plus
    the lookahead, where the restore point first reaches it).

    Example: granularity 64, 16-token chunks: chunk 3 (tokens 48..63) -> 64; chunk 4 -> 128.
    """
    group = layout.groups[group_index]
    end = (chunk + 1) * group.tokens_per_chunk
    lag = group.lookahead if group.draft_tail == "recomputed" else 0
    g = layout.hit_granularity
    return -(-(end + lag) // g) * g


def store_horizon(layout: Layout, group_index: int, chunk: int) -> int:
    """Tokens a producer has computed when it can first store ``chunk``: its first boundary
    plus the largest stored lookahead (the boundary must be admissible)."""
    return first_boundary(layout, group_index, chunk) + layout.max_stored_lookahead


def dense_chunks(group: Group, num_tokens: int) -> int:
    """Every whole chunk whose tokens (lookahead included) are known after ``num_tokens``:
    what an offloader without the contract would store. Example: 16-token chunks, 33
    tokens, no lookahead: 2."""
    return max(0, (num_tokens - group.lookahead) // group.tokens_per_chunk)
