"""Worked examples from DESIGN section 3 and the seed reports, checked by hand."""

from __future__ import annotations

import pytest

from kvtier import coverage, retention
from kvtier.buildinfo import build
from kvtier.coverage import BlockRun, Span
from kvtier.layout import Group, Layout
from kvtier.presets import gemma_3_27b, with_mtp


@pytest.mark.parametrize(
    ("extra", "span", "chunks"),
    [(3, (30, 64), [1, 2, 3]), (1, (32, 64), [2, 3]), (0, (33, 64), [2, 3])],
)
def test_seed_sliding_window_32_hit_64(extra: int, span: tuple[int, int], chunks: list[int]):
    """Seed 000: window 32, 16-token chunks, 64-token hit; E = 3 needs chunk 1 too."""
    g = Group("sliding_window", 16, window=32, extra_retained=extra)
    assert coverage.retained(g, 64) == Span(*span)
    assert list(coverage.required(g, 64)) == chunks
    assert [r.chunk for r in coverage.load_set(g, 64)] == chunks


@pytest.mark.parametrize(("extra", "sliding"), [(0, [2, 3, 6, 7]), (1, [1, 2, 3, 5, 6, 7]),
                                                 (3, [1, 2, 3, 5, 6, 7])])
def test_design_example_full_plus_sliding_33_tokens(extra: int, sliding: list[int]):
    """With E = 1 the whole-prompt hits at 15 and 31 (a 16- or 32-token prompt repeated)
    keep tokens 7 and 23: chunks 1 and 5 are stored too (W + E = 9 is one past a chunk)."""
    layout = Layout((Group("full", 16), Group("sliding_window", 4, window=8,
                                              extra_retained=extra)))
    assert list(coverage.admissible_boundaries(layout, 33)) == [16, 32]
    assert list(coverage.store_set(layout, 0, 33)) == [0, 1]
    assert list(coverage.store_set(layout, 1, 33)) == sliding


def test_seed_store_mask_keeps_chunk_1_for_e3():
    """Seed 001: vLLM's mask at that boundary was [F, F, T, T]; the contract stores chunk 1."""
    layout = Layout((Group("full", 16), Group("sliding_window", 16, window=32, extra_retained=3)))
    stored = coverage.store_set(layout, 1, 65)
    assert 1 in stored
    for b in coverage.admissible_boundaries(layout, 65, num_prompt_tokens=65):
        assert set(coverage.required(layout.groups[1], b)) <= set(stored)


@pytest.mark.parametrize(("window", "extra", "boundary"), [(128, 0, 3904), (128, 3, 3904),
                                                           (256, 1, 3968), (256, 3, 3968)])
def test_seed_unaligned_hits_need_left_chunk(window: int, extra: int, boundary: int):
    """Seed 001's matrix: 64-token blocks, 4 blocks per chunk, unaligned boundaries."""
    g = Group("sliding_window", 64, 4, window=window, extra_retained=extra)
    first_retained_block = (boundary - window + 1 - extra) // 64
    assert coverage.retained_blocks(g, boundary).start == first_retained_block
    assert coverage.required(g, boundary).start == first_retained_block // 4


def test_seed_partial_final_segment_keeps_tail():
    """Seed 002: a final alignment segment of 48 of 64 tokens still stores its tail."""
    layout = Layout((Group("full", 16), Group("sliding_window", 16, window=32)),
                    hit_granularity=16)
    stored = coverage.store_set(layout, 1, 48)
    assert list(stored) == [0, 1, 2]
    assert list(coverage.required(layout.groups[1], 48)) == [1, 2]


def test_draft_group_needs_lookahead_tokens():
    """EAGLE (lookahead 1): a 65-token producer serves 64 only with a 65th token known."""
    layout = Layout((Group("full", 16), Group("full", 16, lookahead=1, name="eagle")))
    assert list(coverage.admissible_boundaries(layout, 64)) == [16, 32, 48]
    assert list(coverage.admissible_boundaries(layout, 65)) == [16, 32, 48, 64]
    assert list(coverage.admissible_boundaries(layout, 65, 65)) == [16, 32, 48, 64]


def test_chunked_local_and_state():
    local = Group("chunked_local", 16, chunk=40)
    assert coverage.retained(local, 48) == Span(40, 48)
    assert list(coverage.required(local, 48)) == [2]
    assert list(coverage.required(local, 80)) == []
    state = Group("state", 16, 2)
    assert list(coverage.required(state, 64)) == [1]
    assert coverage.load_set(state, 64) == (BlockRun(1, 1, 1),)


def test_load_set_skips_blocks_on_device_and_dead_blocks():
    g = Group("sliding_window", 4, 4, window=32, extra_retained=3)
    assert coverage.load_set(g, 64) == (BlockRun(1, 3, 1), BlockRun(2, 0, 4), BlockRun(3, 0, 4))
    assert coverage.load_set(g, 64, on_device=40) == (BlockRun(2, 2, 2), BlockRun(3, 0, 4))
    with pytest.raises(ValueError, match="multiple of tokens_per_block"):
        coverage.load_set(g, 64, on_device=3)


@pytest.mark.skipif(build() == "mypyc", reason="a compiled module's own calls cannot be patched")
def test_store_set_of_a_million_tokens_does_not_walk_tokens(monkeypatch):
    """Cost grows with boundaries, not tokens: count the retained spans it asks for."""
    layout = with_mtp(gemma_3_27b(), 4)
    calls = []
    real = coverage.retained
    for module in (coverage, retention):  # the derived functions and the definitions' own
        monkeypatch.setattr(module, "retained", lambda g, b: calls.append(b) or real(g, b))
    sets = coverage.store_sets(layout, 1_000_000)
    assert sets[0].ranges == ((0, 3906),)
    assert sets[1].ranges == ((0, 3906),)
    assert len(calls) == 2 * 2 * 3906  # 2 groups, 2 hits (b - 1 and b) per boundary


def test_bad_boundary_and_horizon():
    with pytest.raises(ValueError, match="boundary must be >= 0"):
        coverage.retained(Group("full", 16), -1)
    layout = Layout((Group("full", 16),))
    with pytest.raises(ValueError, match="horizon went backwards"):
        coverage.store_delta(layout, 0, 64, 32)
    assert list(coverage.admissible_boundaries(layout, 0)) == []
    assert list(coverage.admissible_boundaries(layout, 100, num_prompt_tokens=1)) == []


def test_recomputed_draft_tail_serves_the_whole_prompt_minus_one():
    """The seed: full + window 32 (E = 3) + MTP modules 1, 2 on 16-token chunks, 65 tokens.

    A stored draft tail caps the hit at 48 (module 2's chunk 3 is keyed through token 65,
    which a 65-token consumer does not know). A recomputed tail hits at 64: the target
    groups restore to 64, both draft groups to 48, and the engine recomputes draft
    positions 48..63 from the target hidden states it stored with the boundary.
    """
    from dataclasses import replace

    base = Layout((Group("full", 16), Group("sliding_window", 16, window=32)))
    stored = with_mtp(base, 4, num_modules=2)
    assert list(coverage.admissible_boundaries(stored, 65, 65)) == [16, 32, 48]
    groups = tuple(replace(g, draft_tail="recomputed") if g.lookahead else g
                   for g in stored.groups)
    layout = stored.with_groups(groups)
    assert list(coverage.admissible_boundaries(layout, 65, 65)) == [16, 32, 48, 64]
    mtp1, mtp2 = layout.groups[2:]
    assert [list(coverage.required(g, 64)) for g in layout.groups] == [
        [0, 1, 2, 3], [1, 2, 3], [0, 1, 2], [0, 1, 2]]
    assert coverage.restore_point(mtp2, 64) == coverage.restore_point(mtp1, 64) == 48


def test_first_boundary_store_horizon_and_dense_chunks():
    layout = Layout((Group("full", 64), Group("sliding_window", 16, window=32),
                     Group("full", 16, lookahead=1, name="eagle")))
    assert [coverage.first_boundary(layout, 1, c) for c in (2, 3, 4)] == [64, 64, 128]
    assert coverage.store_horizon(layout, 1, 3) == 65  # 64 plus the draft's lookahead
    assert coverage.dense_chunks(layout.groups[1], 33) == 2
    assert coverage.dense_chunks(layout.groups[2], 33) == 2 and coverage.dense_chunks(
        layout.groups[2], 32) == 1


def test_a_state_chunk_slot_holds_its_last_block_only():
    """The slot rule the data plane and both adapters ask for (``slot_block``)."""
    window = Group("sliding_window", 4, window=8, blocks_per_chunk=4)
    state = Group("state", 4, blocks_per_chunk=4, bytes_per_state=64)
    assert coverage.blocks_per_slot(window) == 4 and coverage.blocks_per_slot(state) == 1
    assert coverage.slot_block(window, BlockRun(1, 2, 2)) == 2
    assert coverage.slot_block(state, BlockRun(1, 3, 1)) == 0
    # what store_blocks keeps of a state chunk is exactly what its slot holds
    layout = Layout((Group("full", 4, blocks_per_chunk=4), state))
    assert coverage.slot_block(state, coverage.store_blocks(layout, 1, 2)) == 0
    for bad in (BlockRun(1, 2, 1), BlockRun(1, 2, 2), BlockRun(1, 0, 4)):
        with pytest.raises(ValueError, match="holds only its last block"):
            coverage.slot_block(state, bad)
