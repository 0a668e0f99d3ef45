"""The contract's two definitions, and the values it speaks in (DESIGN section 3).

* ``retained(group, b)``: the token interval whose KV the engine keeps to compute position
  ``b`` and beyond (and ``restored``, ``restore_point`` for draft groups whose tail is
  recomputed; ``first_kept_block`` and ``retained_moves_at``, where it frees blocks);
* the admissible boundaries, and the hits a consumer may take at them
  (``admissible_boundaries``, ``admissible_grows_at``, ``consumer_hit``,
  ``whole_prompt_hit``, ``hits_served``).

``Span`` (tokens), ``ChunkRanges`` (chunk indices) and ``BlockRun`` (blocks of one chunk)
are what the contract's answers are made of. Everything derived from these two definitions
(what a hit requires, what a producer stores, what a consumer loads) is
``kvtier.coverage``, which re-exports the contract's names (the serving paths' helpers
are imported from here).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kvtier.layout import Group, Layout


@dataclass(frozen=True, slots=True)
class Span:
    """A half-open token interval ``[start, end)``; empty when ``start >= end``."""

    start: int
    end: int

    def __len__(self) -> int:
        return max(0, self.end - self.start)

    @property
    def empty(self) -> bool:
        return self.start >= self.end


@dataclass(frozen=True)
class ChunkRanges:
    """A set of chunk indices kept as sorted, disjoint, non-adjacent half-open ranges.

    Example: ``ChunkRanges(((0, 2), (6, 8)))`` holds chunks 0, 1, 6, 7 and prints as
    ``0-1,6-7``. Sizes stay small for long requests: a full-attention store set of a
    million tokens is one range.
    """

    ranges: tuple[tuple[int, int], ...]

    def __init__(self, ranges: tuple[tuple[int, int], ...] = ()) -> None:
        # written out: the generated __init__ runs interpreted even in the serving build
        object.__setattr__(self, "ranges", ranges)

    @staticmethod
    def of(ranges: Iterable[tuple[int, int]]) -> ChunkRanges:
        """Normalise any iterable of half-open ranges (overlapping, unsorted, empty)."""
        merged: list[list[int]] = []
        for lo, hi in sorted(r for r in ranges if r[0] < r[1]):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        return ChunkRanges(tuple((lo, hi) for lo, hi in merged))

    @staticmethod
    def from_chunks(chunks: Iterable[int]) -> ChunkRanges:
        return ChunkRanges.of((c, c + 1) for c in chunks)

    def __iter__(self) -> Iterator[int]:
        for lo, hi in self.ranges:
            yield from range(lo, hi)

    def __len__(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)

    def __contains__(self, chunk: object) -> bool:
        if not isinstance(chunk, int):
            return False
        i = bisect.bisect_right(self.ranges, (chunk, float("inf"))) - 1
        return i >= 0 and self.ranges[i][0] <= chunk < self.ranges[i][1]

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def union(self, other: ChunkRanges) -> ChunkRanges:
        return ChunkRanges.of(self.ranges + other.ranges)

    def minus(self, other: ChunkRanges) -> ChunkRanges:
        """Chunks in ``self`` and not in ``other``."""
        out: list[tuple[int, int]] = []
        for lo, hi in self.ranges:
            i = max(0, bisect.bisect_right(other.ranges, (lo, float("inf"))) - 1)
            cur = lo
            while i < len(other.ranges) and other.ranges[i][0] < hi:
                olo, ohi = other.ranges[i]
                if ohi > cur:
                    if olo > cur:
                        out.append((cur, olo))
                    cur = max(cur, ohi)
                i += 1
            if cur < hi:
                out.append((cur, hi))
        return ChunkRanges(tuple(out))

    def compact(self) -> str:
        """``0-3,6,8-9`` style text; ``-`` for the empty set."""
        parts = [f"{lo}" if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in self.ranges]
        return ",".join(parts) or "-"


@dataclass(frozen=True, slots=True)
class BlockRun:
    """Blocks ``[first_block, first_block + num_blocks)`` of ``chunk`` (chunk-relative).

    Example: with 4 blocks per chunk, ``BlockRun(chunk=1, first_block=3, num_blocks=1)``
    is absolute block 7.
    """

    chunk: int
    first_block: int
    num_blocks: int


# --------------------------------------------------------------------------------------
# The two definitions


def retained(group: Group, b: int) -> Span:
    """The token interval whose KV the engine keeps to continue from boundary ``b``.

    Examples (DESIGN section 3): sliding window 32 with ``E = 3`` at ``b = 64`` keeps
    ``[30, 64)``; chunked local with ``C = 8192`` at ``b = 8200`` keeps ``[8192, 8200)``;
    a state group at ``b`` keeps the state after token ``b - 1``, written ``[b - 1, b)``.
    """
    if b < 0:
        raise ValueError(f"boundary must be >= 0, got {b}")
    if b == 0:
        return Span(0, 0)
    if group.kind == "full":
        return Span(0, b)
    if group.kind == "sliding_window":
        assert group.window is not None
        return Span(max(0, b - group.window + 1 - group.extra_retained), b)
    if group.kind == "chunked_local":
        assert group.chunk is not None
        return Span((b // group.chunk) * group.chunk, b)
    return Span(b - 1, b)


NEVER = 1 << 62
"""A position no request reaches (``retained_moves_at`` of a group that keeps token 0)."""


def first_kept_block(group: Group, b: int) -> int:
    """The first block the engine may still hold at position ``b``: that of
    ``retained(group, b)``'s first token, or of ``b`` where it keeps none (every block
    before is freed). vLLM frees the blocks before it as it schedules a request that has
    computed ``b`` tokens. Examples: sliding window 32, ``E = 3``, 4-token blocks: block 7
    at 64 (token 30); chunked local ``C = 16``: block 4 at 16 and at 31."""
    t = group.tokens_per_block
    if group.kind == "sliding_window":
        assert group.window is not None
        return max(0, b - group.window + 1 - group.extra_retained) // t
    if group.kind == "chunked_local":
        assert group.chunk is not None
        return b // group.chunk * group.chunk // t
    if group.kind == "state":
        return max(0, b - 1) // t
    return 0


def retained_moves_at(group: Group, b: int) -> int:
    """The first position past ``b`` at which ``first_kept_block`` grows, or ``NEVER``
    (full attention keeps every block). Examples: sliding window 32, ``E = 3``, 4-token
    blocks: 38 at 10 (block 0 is freed once token 4 is out of the window), 66 at 64;
    chunked local ``C = 16``, 4-token blocks: 32 at 20."""
    first, t = first_kept_block(group, b), group.tokens_per_block
    if group.kind == "sliding_window":
        assert group.window is not None
        return (first + 1) * t + group.window - 1 + group.extra_retained
    if group.kind == "chunked_local":
        assert group.chunk is not None
        k = b // group.chunk + 1
        while k * group.chunk // t <= first:  # chunks smaller than a block
            k += 1
        return k * group.chunk
    if group.kind == "state":
        return (first + 1) * t + 1
    return NEVER

def restore_point(group: Group, b: int) -> int:
    """The token up to which a hit at ``b`` restores ``group``'s KV; the engine computes on.

    ``b`` for every group but a draft group with a recomputed tail, where it is the last
    chunk end ``e`` with ``e + lookahead <= b``. Example: 16-token chunks, ``b = 64``:
    48 for lookahead 1 or 2 (chunk 3 ends at 64 and is keyed through token 64 or 65).
    """
    if group.draft_tail == "stored" or not group.lookahead:
        return b
    t = group.tokens_per_chunk
    return max(0, (b - group.lookahead) // t * t)


def restored(group: Group, b: int) -> Span:
    """The token interval a hit at ``b`` restores: ``retained(group, restore_point(group, b))``.

    Equal to ``retained(group, b)`` except for draft groups with a recomputed tail, whose
    engine continues from the restore point. Example: full attention, lookahead 2, recomputed,
    16-token chunks, ``b = 64``: ``[0, 48)``.
    """
    return retained(group, restore_point(group, b))


def admissible_boundaries(
    layout: Layout, num_tokens: int, num_prompt_tokens: int | None = None
) -> range:
    """Boundaries at which a hit may end, ascending.

    A producer knowing ``num_tokens`` tokens can serve ``b`` when ``b + d_max <= num_tokens``.
    A consumer passes its known tokens too (a new request's prompt; a resumed one's prompt
    and output), capping ``b`` at ``num_prompt_tokens - 1`` (the last token is computed to
    produce logits), or at ``num_prompt_tokens`` where ``whole_prompt_hit`` allows it (the
    hit at that boundary restores one token less: ``consumer_hit``).

    Example: granularity 16, no draft layers, a 33-token prompt: ``range(16, 33, 16)``,
    that is 16 and 32; a 32-token prompt: 16 and 32 (32 restores 31 tokens).
    """
    top = num_tokens - layout.max_stored_lookahead
    if num_prompt_tokens is not None:
        whole = whole_prompt_hit(layout, num_prompt_tokens)
        top = min(top, num_prompt_tokens if whole else num_prompt_tokens - 1)
    g = layout.hit_granularity
    return range(g, max(g, top + 1), g)


def admissible_grows_at(layout: Layout, count: int) -> int:
    """The fewest known tokens at which a producer has more than ``count`` admissible
    boundaries (``admissible_boundaries(layout, n)`` holds more than ``count`` exactly when
    ``n`` is at least this): the boundary after the ``count``-th, and the stored lookahead
    past it. Example: granularity 16, no draft layers: 16 tokens for the first boundary, 32
    for the second."""
    return (count + 1) * layout.hit_granularity + layout.max_stored_lookahead


def whole_prompt_hit(layout: Layout, num_tokens: int) -> bool:
    """Whether a consumer knowing ``num_tokens`` tokens may hit at boundary ``num_tokens``,
    restoring ``retained(g, num_tokens - 1)`` of every group (``consumer_hit``).

    Not when a draft group's tail is stored (its chunks ending at ``num_tokens`` are keyed
    by tokens past it), nor when a state group keeps no state after token ``num_tokens - 2``
    (it stores the state at each chunk end: only one-token chunks have one there).
    Examples: full attention with sliding window or chunked local -> True; with a state
    group of 64-token chunks -> False; with an EAGLE group whose tail is stored -> False.
    """
    if layout.max_stored_lookahead or num_tokens < 2:
        return False
    return all(not (num_tokens - 1) % t for t in layout.state_chunk_tokens)


def consumer_hit(b: int, num_prompt_tokens: int) -> int:
    """The tokens a consumer's hit at boundary ``b`` restores: ``b``, or for the boundary at
    the end of its known tokens (a whole-prompt hit) one less, so the engine computes the
    last token again for its logits. Every hit at ``h`` needs ``required(g, h)`` and loads
    ``load_set(g, h, ..)``. Example: a 256-token prompt: 192 -> 192, 256 -> 255.
    """
    return min(b, num_prompt_tokens - 1)


def consumer_hits(layout: Layout, num_prompt_tokens: int) -> list[int]:
    """Every hit a consumer knowing ``num_prompt_tokens`` tokens may take, ascending:
    ``consumer_hit`` of each consumer-admissible boundary (positive, without repeats).

    Example: granularity 64, a 256-token prompt: [64, 128, 192, 255]; 257 tokens:
    [64, 128, 192, 256].
    """
    out = list(admissible_boundaries(layout, num_prompt_tokens, num_prompt_tokens))
    # only the last boundary can pass the known tokens' end (a whole-prompt hit): it is
    # the one ``consumer_hit`` changes, and the one that may repeat its predecessor
    if out and consumer_hit(out[-1], num_prompt_tokens) != out[-1]:
        h = consumer_hit(out.pop(), num_prompt_tokens)
        if h > 0 and (not out or h > out[-1]):
            out.append(h)
    return out


def consumer_hits_between(layout: Layout, num_prompt_tokens: int, low: int, high: int | None
                          ) -> list[int]:
    """``[h for h in consumer_hits(layout, num_prompt_tokens) if low < h <= high]`` (no
    bound for ``high`` None), counted on the admissible boundaries (a range) rather than
    listed: a long prompt has hundreds, a lookup bounded by a block hit wants a few.

    Example: granularity 64, a 256-token prompt, 64 < h <= 255: [128, 192, 255].
    """
    bounds = admissible_boundaries(layout, num_prompt_tokens, num_prompt_tokens)
    first, step, n = bounds.start, bounds.step, len(bounds)
    last = first + (n - 1) * step
    end: list[int] = []  # the whole-prompt hit, restoring a token less: the largest, if new
    if n and (h := consumer_hit(last, num_prompt_tokens)) != last:
        n -= 1
        if h > max(0, low, last - step if n else 0) and (high is None or h <= high):
            end.append(h)
    since = _at_most(first, step, n, low)
    until = n if high is None else _at_most(first, step, n, high)
    return [*range(first + since * step, first + until * step, step), *end]


def _at_most(first: int, step: int, n: int, x: int) -> int:
    """How many of the ``n`` boundaries ``first, first + step, ..`` are at most ``x``."""
    return 0 if x < first else min(n, (x - first) // step + 1)


def hits_served(layout: Layout, b: int) -> tuple[int, ...]:
    """The hits a producer serving boundary ``b`` stores for, ascending: ``b`` (a consumer
    knowing more tokens), and ``b - 1`` (the whole-prompt hit of a consumer whose tokens
    end at ``b``) where ``whole_prompt_hit`` allows it.

    Example: full attention, 64-token chunks: 256 -> (255, 256); with a state group of
    64-token chunks: 256 -> (256,).
    """
    return (b - 1, b) if whole_prompt_hit(layout, b) else (b,)
