"""Boundary selection: the modes' definitions, with exact boundaries (kvtier.boundaries)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import boundaries, coverage
from kvtier.layout import Group, Layout
from strategies import layouts

G16 = Layout((Group("full", 16, 1), Group("sliding_window", 16, 1, window=16)))
# a state group of 16-token chunks keeps no state after token b - 2: no whole-prompt hit
G16S = Layout((Group("full", 16, 1), Group("state", 16, 1)))


def test_modes_worked_examples() -> None:
    assert boundaries.last_boundary(G16, 100) == 96
    assert boundaries.last_boundary(G16, 15) == 0
    assert boundaries.newly_served(G16, "dense", 32, 70, prompt_end=100) == [48, 64]
    assert boundaries.newly_served(G16, "end", 0, 70, prompt_end=100) == []
    assert boundaries.newly_served(G16, "end", 0, 100, prompt_end=100) == [96]
    assert boundaries.newly_served(G16, "shared", 0, 100, prompt_end=100, shared=64) == [64, 96]
    assert boundaries.newly_served(G16, "shared", 0, 100, prompt_end=100, shared=96) == [96]
    assert boundaries.served_boundaries(
        G16, "shared", [40, 100, 120], prompt_end=100, shared=64) == [64, 96, 112]
    assert boundaries.served_boundaries(G16, "end", [40, 100, 160], prompt_end=100) == [96, 160]
    # a prompt that ends on a boundary: its repeat takes the whole-prompt hit there (95)
    assert boundaries.consumer_end(G16, 96) == 96 and boundaries.consumer_end(G16, 100) == 96
    assert boundaries.prompt_ends(G16, 96) == [80, 96] and boundaries.prompt_ends(G16, 100) == [96]
    assert boundaries.newly_served(G16, "end", 0, 96, prompt_end=96) == [80, 96]
    assert boundaries.newly_served(G16, "end", 0, 128, prompt_end=96) == [80, 96, 128]
    assert boundaries.newly_served(G16, "shared", 0, 96, prompt_end=96, shared=96) == [80, 96]
    assert boundaries.newly_served(G16, "end", 96, 96, prompt_end=96) == []
    # without whole-prompt hits (a state group) the repeat hits one granule earlier
    assert boundaries.consumer_end(G16S, 96) == 80 and boundaries.prompt_ends(G16S, 96) == [80]
    assert boundaries.newly_served(G16S, "end", 0, 112, prompt_end=96) == [80, 112]
    # store limits cut the prompt at 96 of 120: a consumer of the whole prompt can hit at 96
    assert boundaries.newly_served(G16, "end", 0, 96, prompt_end=96, num_prompt=120) == [96]


def test_shared_point_reads_full_attention_only() -> None:
    assert boundaries.shared_point(G16, 90, [4, 0]) == 64
    assert boundaries.shared_point(G16, 90, [99, 0]) == 80  # capped at prompt - 1
    assert boundaries.shared_point(G16, 96, [99, 0]) == 96  # its whole-prompt hit
    assert boundaries.shared_point(G16S, 96, [99, 0]) == 80
    assert boundaries.shared_point(G16, 90, [0, 9]) == 0
    sliding_only = Layout((Group("sliding_window", 16, 1, window=16),))
    assert boundaries.shared_point(sliding_only, 90, [9]) == 0


def test_unknown_mode_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="dense, end, shared"):
        boundaries.newly_served(G16, "stride", 0, 100, prompt_end=100)  # type: ignore[arg-type]


@settings(max_examples=400)
@given(layouts(), st.integers(1, 300), st.lists(st.integers(0, 120), min_size=1, max_size=5),
       st.integers(0, 300))
def test_every_mode_serves_admissible_boundaries_and_stores_full_groups_whole(
    layout: Layout, prompt: int, steps: list[int], shared: int
) -> None:
    reports = [prompt + sum(steps[:i]) for i in range(len(steps))]
    shared = boundaries.shared_point(layout, prompt, [shared] * len(layout.groups))
    final = {}
    for mode in boundaries.BOUNDARY_MODES:
        served = boundaries.served_boundaries(
            layout, mode, reports, prompt_end=prompt, shared=shared)
        assert set(served) <= set(coverage.admissible_boundaries(layout, reports[-1]))
        if mode != "dense" and reports[-1] == prompt:  # only the prompt: its consumer end
            assert served == [] or served[-1] == boundaries.consumer_end(layout, prompt)
            continue
        if mode != "dense":
            assert served == [] or served[-1] == boundaries.last_boundary(layout, reports[-1])
        final[mode] = [
            coverage.store_set(layout, gi, reports[-1], served)
            for gi, g in enumerate(layout.groups) if coverage.needs_predecessor(g)
        ]
    # past the prompt, full-attention groups end up stored whole in every mode
    assert all(sets == final["dense"] for sets in final.values())
