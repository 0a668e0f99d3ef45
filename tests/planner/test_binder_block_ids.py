"""The binder's planned chunks over engine block tables of every kind (plain ids, None for
a freed block, negative ids, ids that are not integers) are exactly what
``block_ids_at`` gives chunk by chunk: its fast paths check a bounded span of a row at
once and must neither keep a chunk whose blocks are gone nor drop one that is held."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import coverage
from kvtier.layout import Group, Layout
from kvtier.planner.binding import ChunkBinder, load_runs
from kvtier.planner.requests import block_ids_at
from strategies import layouts

LAYOUT = Layout((Group("full", 4, 2), Group("sliding_window", 4, 2, window=6)))
ID = st.one_of(st.integers(0, 50), st.just(None), st.just(-1), st.sampled_from([True, 2.5]))


def expected(pending: list[tuple[int, int]], table: list[list[object]]
             ) -> list[tuple[int, int, int, tuple[int, ...]]]:
    out = []
    for gi, chunk in pending:
        run = coverage.store_blocks(LAYOUT, gi, chunk)
        first = chunk * LAYOUT.groups[gi].blocks_per_chunk + run.first_block
        ids = block_ids_at(table, gi, first, run.num_blocks)
        if ids is not None:
            out.append((gi, chunk, run.first_block, ids))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ID, max_size=40), min_size=2, max_size=2),
       st.lists(st.tuples(st.integers(0, 1), st.integers(0, 22)), max_size=12),
       st.integers(0, 3))
def test_live_chunks_match_block_ids_at(table: list[list[object]],
                                        pending: list[tuple[int, int]], plain: int) -> None:
    if plain:  # mostly plain rows too, so the fast paths run on long tables
        table = [[i % 7 if plain > 1 else i for i in range(60)], table[1]]
    binder = ChunkBinder(LAYOUT)
    try:
        want = expected(pending, table)
    except ValueError:
        with pytest.raises(ValueError):
            binder.live(pending, table)
        return
    got = [(c.group, c.chunk, c.first_block, c.block_ids) for c in binder.live(pending, table)]
    assert got == want


def test_a_freed_block_past_the_first_span_drops_its_chunk() -> None:
    row: list[int | None] = list(range(600))
    row[520] = None  # chunk 260 of the full group, far past the first 256-block span
    binder = ChunkBinder(LAYOUT)
    pending = [(0, 0), (0, 259), (0, 260), (0, 261)]
    got = [c.chunk for c in binder.live(pending, [row, list(range(600))])]
    assert got == [0, 259, 261]
    assert got != [c for _, c in pending]  # negative control: the comparison sees the drop


def _load_into(rows: list[object]) -> object:
    """A hit of 48 tokens over LAYOUT loaded into block table ``rows``: its copies' block
    ids, or the error the planner raised."""
    from kvtier.keys import Namespace
    from kvtier.planner import Planner
    from kvtier.store import ChunkStore

    planner = Planner(LAYOUT, ChunkStore(100), Namespace("t"))
    tokens = list(range(50))
    planner.add_request("p", tokens)
    job = planner.on_computed("p", 50, [list(range(13)), list(range(13))])
    assert job is not None
    planner.complete_store(job.id, True)
    planner.add_request("c", tokens)
    assert planner.lookup("c").hit_tokens == 48
    try:
        load = planner.accept_hit("c", rows)  # type: ignore[arg-type]
    except ValueError as e:
        return f"ValueError: {e}"
    return [(c.group, c.chunk, c.block_ids) for c in load.copies]


@pytest.mark.parametrize("start", [0, 7, -1, -30])
def test_a_row_given_as_a_range_loads_as_its_list(start: int) -> None:
    """A range row (ids by arithmetic, as the replay's tables) takes a shortcut when the
    binder checks what a row holds: the copies, or the refusal, are the list's."""
    as_range = _load_into([range(start, start + 13), range(start + 20, start + 33)])
    as_list = _load_into([list(range(start, start + 13)), list(range(start + 20, start + 33))])
    assert as_range == as_list
    if start >= 0:  # negative control: other ids give other copies
        assert as_range != _load_into([range(start + 1, start + 14), range(20, 33)])
    descending = [range(start + 12, start - 1, -1), range(start + 32, start + 19, -1)]
    assert _load_into(descending) == _load_into([list(r) for r in descending])


@settings(max_examples=150, deadline=None)
@given(layouts(), st.integers(0, 2000), st.integers(0, 2000))
def test_a_layouts_cached_load_runs_are_its_groups_load_sets(layout: Layout, b: int,
                                                             on_device: int) -> None:
    """``load_runs`` (cached per layout, group and boundary) gives each group's own
    ``coverage.load_set``, whatever layouts were asked before."""
    for gi, group in enumerate(layout.groups):
        held = min(on_device, b) // group.tokens_per_block * group.tokens_per_block
        assert load_runs(layout, gi, b, held) == coverage.load_set(group, b, held)
    other = Layout((Group("sliding_window", 16, 1, window=32),))
    assert load_runs(other, 0, 512) == coverage.load_set(other.groups[0], 512)
    assert load_runs(other, 0, 512) != coverage.load_set(Group("full", 16), 512)
