"""The planner's per-boundary table of a dense producer's new chunks gives, for any steps
taken in any order by any number of requests, exactly ``coverage.dense_delta`` (all groups,
and each group alone); its table of ``coverage.serve_delta`` gives exactly that, remembered
or not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import coverage
from kvtier.layout import Group, Layout
from kvtier.planner.serving import DenseChunks, ServedChunks
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
            for gi in range(len(layout.groups)):
                assert table.of_group(gi, boundaries, boundaries + step) == [
                    p for p in got if p[0] == gi]
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


@settings(max_examples=150, deadline=None)
@given(layouts(), st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=12),
                           min_size=1, max_size=4))
def test_served_chunks_match_serve_delta(layout: Layout, producers: list[list[int]]) -> None:
    """Producers serving boundaries in steps of 1-3 granules (served lists past ``SHORT``
    too), several over the same boundaries so that answers come back remembered."""
    table, g = ServedChunks(layout), layout.hit_granularity
    for steps in producers * 2:
        served: list[int] = []
        for step in steps:
            new = [served[-1] + g * step if served else g * step]
            want = [(gi, c) for gi in range(len(layout.groups))
                    for c in coverage.serve_delta(layout, gi, served, new)]
            assert [p for gi in range(len(layout.groups))
                    for p in table.delta(gi, served, new)] == want
            served += new


def test_the_served_comparison_sees_another_served_list() -> None:  # negative control
    layout = Layout((Group("full", 16), Group("sliding_window", 16, window=32)))
    table = ServedChunks(layout)
    assert table.delta(1, [32], [96]) == ((1, 4), (1, 5))
    assert table.delta(1, [80], [96]) == ((1, 5),) != table.delta(1, [32], [96])
