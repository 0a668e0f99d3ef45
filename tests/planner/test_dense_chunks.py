"""The planner's per-boundary table of a dense producer's new chunks gives, for any steps
taken in any order by any number of requests, exactly ``coverage.dense_delta``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import coverage
from kvtier.layout import Group, Layout
from kvtier.planner.serving import DenseChunks
from strategies import layouts


def expected(layout: Layout, old: int, new: int) -> list[tuple[int, int]]:
    return [(gi, c) for gi in range(len(layout.groups))
            for c in coverage.dense_delta(layout, gi, old, new)]


@settings(max_examples=150, deadline=None)
@given(layouts(), st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=8),
                           min_size=1, max_size=4))
def test_steps_of_several_requests_match_dense_delta(layout: Layout,
                                                     requests: list[list[int]]) -> None:
    table = DenseChunks(layout)  # one table shared by the requests, as in the planner
    for steps in requests:
        boundaries = 0
        for step in steps:
            got = table.between(boundaries, boundaries + step)
            assert got == expected(layout, boundaries, boundaries + step)
            boundaries += step


def test_a_table_filled_far_ahead_answers_early_steps() -> None:
    layout = Layout((Group("full", 16, 2), Group("sliding_window", 16, window=40),
                     Group("chunked_local", 8, 2, chunk=48)))
    table = DenseChunks(layout)
    assert table.between(30, 40) == expected(layout, 30, 40)
    for old, new in [(0, 1), (1, 7), (7, 30), (3, 4), (0, 40)]:
        assert table.between(old, new) == expected(layout, old, new)


def test_the_comparison_sees_a_chunk_too_many() -> None:  # negative control
    layout = Layout((Group("full", 16), Group("sliding_window", 16, window=32)))
    got = DenseChunks(layout).between(2, 5)
    assert got == expected(layout, 2, 5)
    assert got != expected(layout, 1, 5)
