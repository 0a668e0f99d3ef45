"""``lookup.assess`` and ``lookup.assess_at_once`` against a brute-force oracle: every
candidate, every chunk, every kind.

``assess`` walks the candidates from the largest down and classifies each chunk once;
``assess_at_once`` (for a store whose lookup changes nothing) classifies spans of chunks in
fewer store lookups; the oracle checks every chunk of every candidate from scratch. They
must agree on the best ready, readable and soon boundaries, and ``hit_keys`` must name
every key a best hit loads.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import coverage
from kvtier.keys import ChunkKey, KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.planner.lookup import Availability, assess, assess_at_once, candidate_hits, hit_keys
from kvtier.store.results import ChunkState
from strategies import layouts

STATES = [ChunkState.ABSENT, ChunkState.WRITING, ChunkState.READY, ChunkState.PINNED]


def oracle(layout: Layout, chain: KeyChain, candidates: list[int], on_device: int,
           state: dict[ChunkKey, ChunkState], elsewhere: set[ChunkKey]) -> tuple[int, ...]:
    def ok(key: ChunkKey, which: int) -> bool:
        st_ = state.get(key, ChunkState.ABSENT)
        readable = st_ in (ChunkState.READY, ChunkState.PINNED)
        return [readable and key not in elsewhere, readable,
                readable or key in elsewhere or st_ is ChunkState.WRITING][which]

    best = []
    for which in range(3):
        best.append(next((b for b in candidates if all(
            ok(k, which) for gi, g in enumerate(layout.groups)
            for k in chain.keys(gi, coverage.load_chunks(g, b, on_device)))), on_device))
    return tuple(best)


Walk = Callable[..., Availability]


@pytest.mark.parametrize("walk", [assess, assess_at_once])
@settings(max_examples=300, deadline=None)
@given(layout=layouts(), data=st.data())
def test_assess_matches_the_oracle(walk: Walk, layout: Layout, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 300))
    chain = KeyChain(layout, Namespace("m"), range(n))
    tpb = max(g.tokens_per_block for g in layout.groups)
    blocks = [b for b in range(0, n, tpb)
              if all(b % g.tokens_per_block == 0 for g in layout.groups)]
    on_device = data.draw(st.sampled_from(blocks or [0]))
    candidates = candidate_hits(layout, n, on_device, None)
    state: dict[ChunkKey, ChunkState] = {}
    elsewhere: set[ChunkKey] = set()
    for gi, g in enumerate(layout.groups):
        needed = {c for b in candidates for c in coverage.load_chunks(g, b, on_device)}
        for k in chain.keys(gi, sorted(needed)):
            state[k] = data.draw(st.sampled_from(STATES + [ChunkState.READY] * 4))
            if data.draw(st.integers(0, 9)) == 0:
                elsewhere.add(k)
    states = lambda ks: [state.get(k, ChunkState.ABSENT) for k in ks]  # noqa: E731
    avail = walk(layout, chain, candidates, on_device, states, elsewhere.__contains__)
    want = oracle(layout, chain, candidates, on_device, state, elsewhere)
    assert (avail.best_ready, avail.best_readable, avail.best_soon) == want
    for b in {avail.best_ready, avail.best_readable} - {on_device}:
        got = hit_keys(layout, chain, b, on_device)
        assert got == [[chain.key(gi, c) for c in coverage.load_chunks(g, b, on_device)]
                       for gi, g in enumerate(layout.groups)]


WINDOWED = Layout((Group("full", 16), Group("sliding_window", 16, window=32)))


def _window_walk(walk: Walk, absent: set[tuple[int, int]]) -> tuple[tuple[int, ...], int]:
    """A 400-token prompt whose chunks are all stored but ``absent`` (group, chunk) pairs:
    the best boundaries of ``walk`` and the store lookups it made."""
    chain = KeyChain(WINDOWED, Namespace("m"), range(400))
    gone = {chain.key(gi, c) for gi, c in absent}
    calls = []

    def states(keys: list[ChunkKey]) -> list[ChunkState]:
        calls.append(keys)
        return [ChunkState.ABSENT if k in gone else ChunkState.READY for k in keys]

    candidates = candidate_hits(WINDOWED, 400, 0, None)
    avail = walk(WINDOWED, chain, candidates, 0, states, None)
    return (avail.best_ready, avail.best_readable, avail.best_soon), len(calls)


def test_a_walk_down_a_window_takes_fewer_store_lookups_at_once() -> None:
    """The window's chunks of every boundary above 64 are absent: both walks go down the
    candidates (399, 384, .. 64) and agree; ``assess`` looks the window up once per
    candidate (24 lookups), ``assess_at_once`` in spans that double (6)."""
    absent = {(1, c) for c in range(4, 25)}
    walked, walked_calls = _window_walk(assess, absent)
    at_once, at_once_calls = _window_walk(assess_at_once, absent)
    assert walked == at_once == (64, 64, 64)
    assert walked_calls > 20 and at_once_calls <= 6
    # negative control: the comparison sees one more absent chunk (the full group's chunk 3)
    assert _window_walk(assess_at_once, absent | {(0, 3)})[0] == (48, 48, 48) != at_once


@settings(max_examples=400, deadline=None)
@given(layout=layouts(), n=st.integers(0, 400), on_device=st.integers(0, 420),
       max_load=st.none() | st.integers(0, 420))
def test_candidates_are_the_consumer_hits_in_range_largest_first(
        layout: Layout, n: int, on_device: int, max_load: int | None) -> None:
    """Found from the admissible boundaries without listing every consumer hit, they are
    exactly ``coverage.consumer_hits`` past ``on_device`` and within ``max_load`` of it."""
    hits = coverage.consumer_hits(layout, n)
    want = [h for h in reversed(hits)
            if h > on_device and (max_load is None or h <= on_device + max_load)]
    assert candidate_hits(layout, n, on_device, max_load) == want


def test_a_whole_prompt_hit_that_repeats_its_predecessor_is_not_a_second_candidate() -> None:
    one = Layout((Group("full", 1),))  # boundaries 1..5; the last restores 4 tokens
    assert coverage.consumer_hits(one, 5) == [1, 2, 3, 4]
    assert candidate_hits(one, 5, 0, None) == [4, 3, 2, 1]
    assert candidate_hits(one, 5, 2, 2) == [4, 3]
