"""A request's block hit (``block_hit``) is the largest admissible boundary at which every
group's required chunks are cached: checked against that definition, asked boundary by
boundary, on full-attention, hybrid and draft layouts, with chunks cached at random."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import coverage
from kvtier.layout import Group, Layout
from kvtier.replay.hits import HitPlans, block_hit
from kvtier.replay.refs import RefsPlanner, RequestRefs, replay_namespace
from kvtier.replay.trace import TraceRequest

LAYOUTS = [
    Layout((Group("full", 16),)),
    Layout((Group("full", 16), Group("sliding_window", 16, window=40))),
    Layout((Group("sliding_window", 16, window=20), Group("chunked_local", 16, chunk=32))),
    Layout((Group("full", 16), Group("full", 16, lookahead=1, name="draft"))),
]
BLOCK = 16


def by_definition(layout: Layout, store_tokens: int, cached: set[tuple[int, int]]) -> int:
    for b in reversed(coverage.admissible_boundaries(layout, store_tokens)):
        if all((gi, c) in cached for gi, g in enumerate(layout.groups)
               for c in coverage.required(g, b)):
            return b
    return 0


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(LAYOUTS))), st.integers(1, 12), st.integers(0, 2**32),
       st.floats(0.0, 1.0), st.booleans())
def test_the_block_hit_is_the_largest_boundary_whose_chunks_are_all_cached(
        which: int, blocks: int, seed: int, density: float, leading: bool) -> None:
    layout = LAYOUTS[which]
    refs = RefsPlanner(layout, replay_namespace(layout), BLOCK, "blocks").refs(
        TraceRequest(0.0, blocks * BLOCK - 3, 1, tuple(range(blocks))))
    rng = random.Random(seed)
    cut = rng.randrange(len(refs.keys) + 1)  # a leading run, as a prefix cache holds
    where = ["host" if (i < cut if leading else rng.random() < density) else ""
             for i in range(len(refs.keys))]
    cached = {(g, c) for g, c, w in zip(refs.groups, refs.chunks, where, strict=True) if w}
    plans = HitPlans()
    assert block_hit(layout, refs, where, plans) == by_definition(layout, refs.store_tokens,
                                                                  cached)
    assert block_hit(layout, refs, where, plans) == block_hit(layout, refs, where)  # cached


@pytest.mark.parametrize("layout", LAYOUTS)
def test_negative_control_one_chunk_missing_lowers_the_hit(layout: Layout) -> None:
    refs = RefsPlanner(layout, replay_namespace(layout), BLOCK, "blocks").refs(
        TraceRequest(0.0, 8 * BLOCK, 1, tuple(range(8))))
    whole = block_hit(layout, refs, ["host"] * len(refs.keys))
    assert whole > 0
    missing = ["host"] * len(refs.keys)
    first = next(i for i, (g, c) in enumerate(zip(refs.groups, refs.chunks, strict=True))
                 if c in coverage.required(layout.groups[g], whole))
    missing[first] = ""
    assert block_hit(layout, refs, missing) < whole


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(LAYOUTS))), st.integers(1, 12), st.integers(0, 2**32),
       st.floats(0.0, 1.0))
def test_chunks_a_request_does_not_reference_are_never_cached(
        which: int, blocks: int, seed: int, dropped: float) -> None:
    """References with gaps (a caller's partial list): a chunk not referenced counts as
    absent, whether it lies below a group's largest referenced chunk or past it."""
    layout = LAYOUTS[which]
    full = RefsPlanner(layout, replay_namespace(layout), BLOCK, "blocks").refs(
        TraceRequest(0.0, blocks * BLOCK - 3, 1, tuple(range(blocks))))
    rng = random.Random(seed)
    kept = [i for i in range(len(full.keys)) if rng.random() >= dropped]
    refs = RequestRefs(full.num_prompt, full.store_tokens, [full.keys[i] for i in kept],
                       tuple(full.groups[i] for i in kept), tuple(full.chunks[i] for i in kept),
                       tuple(full.horizons[i] for i in kept), full.prompt, full.stored)
    where = ["host" if rng.random() < 0.8 else "" for _ in kept]
    cached = {(g, c) for g, c, w in zip(refs.groups, refs.chunks, where, strict=True) if w}
    assert block_hit(layout, refs, where) == by_definition(layout, refs.store_tokens, cached)
