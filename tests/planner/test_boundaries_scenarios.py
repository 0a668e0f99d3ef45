"""Boundary modes through the planner, with exact chunk indices (kvtier.boundaries).

Layout: full attention and sliding window 16, both in 16-token chunks, granularity 16, so
a hit at ``b`` needs full chunks ``0 .. b/16 - 1`` and sliding chunk ``b/16 - 1`` only.
"""

from __future__ import annotations

import pytest
from harness import Harness, loaded

from kvtier.layout import Group, Layout
from kvtier.planner import Outcome, RequestLimits

LAYOUT = Layout((Group("full", 16), Group("sliding_window", 16, window=16)))
DOC = list(range(64))  # the shared document: chunks 0..3
A = [*DOC, *range(1000, 1036)]  # 100 tokens
B = [*DOC, *range(2000, 2026)]  # 90 tokens, diverges from A at 64
C = [*DOC, *range(3000, 3030)]  # 94 tokens, diverges from both at 64


def run(h: Harness, rid: str, tokens: list[int], mode: str) -> tuple[int, dict[int, list[int]]]:
    """Look up (loading a hit), compute the prompt, store: (hit tokens, chunks stored)."""
    p = h.planner
    p.add_request(rid, tokens, limits=RequestLimits(boundaries=mode))  # type: ignore[arg-type]
    found = p.lookup(rid)
    hit = 0
    if found.outcome is Outcome.HIT:
        job = p.accept_hit(rid, h.table(len(tokens), found.hit_tokens))
        p.complete_load(job.id, True)
        hit = found.hit_tokens
    store = p.on_computed(rid, len(tokens), h.table(len(tokens)))
    stored = {} if store is None else loaded(store)
    if store is not None:
        p.complete_store(store.id, True)
    p.finish(rid)
    return hit, stored


def test_shared_stores_the_divergence_point_where_a_third_request_hits():
    h = Harness(LAYOUT)
    # A is the first request of the document: it serves its end, 96 (sliding chunk 5)
    assert run(h, "a", A, "shared") == (0, {0: [0, 1, 2, 3, 4, 5], 1: [5]})
    # B finds A's full chunks 0..3: it shares 64, serves 64 and its end 80; no hit yet
    assert run(h, "b", B, "shared") == (0, {0: [4], 1: [3, 4]})
    # C hits at the divergence point B served
    assert run(h, "c", C, "shared") == (64, {0: [4], 1: [4]})
    m = h.planner.metrics
    assert (m.chunks_stored, m.hit_tokens) == (8 + 4, 64)  # full + sliding


def test_dense_stores_every_sliding_chunk_and_hits_earlier():
    h = Harness(LAYOUT)
    assert run(h, "a", A, "dense") == (0, {0: [0, 1, 2, 3, 4, 5], 1: [0, 1, 2, 3, 4, 5]})
    assert run(h, "b", B, "dense") == (64, {0: [4], 1: [4]})
    assert run(h, "c", C, "dense") == (64, {0: [4], 1: [4]})
    assert (h.planner.metrics.chunks_stored, h.planner.metrics.hit_tokens) == (8 + 8, 128)


def test_end_serves_only_prompt_ends_so_the_document_never_hits():
    h = Harness(LAYOUT)
    assert run(h, "a", A, "end") == (0, {0: [0, 1, 2, 3, 4, 5], 1: [5]})
    assert run(h, "b", B, "end") == (0, {0: [4], 1: [4]})
    assert run(h, "c", C, "end")[0] == 0
    # the same prompt again hits at its end
    assert run(h, "a2", A, "end")[0] == 96


def test_chunked_prefill_defers_sliding_chunks_to_the_prompt_end():
    h = Harness(LAYOUT)
    p = h.planner
    p.add_request("a", A, limits=RequestLimits(boundaries="end"))
    first = p.on_computed("a", 40, h.table(100))
    assert first is not None and loaded(first) == {0: [0, 1]}  # full chunks as usual
    second = p.on_computed("a", 100, h.table(100))
    assert second is not None and loaded(second) == {0: [2, 3, 4, 5], 1: [5]}
    assert p.request_metrics("a").chunks_offered == 7


@pytest.mark.parametrize("mode", ["end", "shared"])
def test_a_prefill_step_past_the_last_boundary_serves_the_prompt_end_at_once(mode: str):
    """Chunked prefill reports 96 (the prompt's last boundary, before its end at 100), then
    100: 96's window is stored at 96, while the engine still holds it (by the prompt's
    last step a window slides past it), and nothing more at 100."""
    h = Harness(LAYOUT)
    p = h.planner
    p.add_request("a", A, limits=RequestLimits(boundaries=mode))  # type: ignore[arg-type]
    first = p.on_computed("a", 96, h.table(100))
    assert first is not None and loaded(first) == {0: [0, 1, 2, 3, 4, 5], 1: [5]}
    p.complete_store(first.id, True)
    assert p.on_computed("a", 100, h.table(100)) is None
    p.finish("a")
    assert run(h, "a2", A, mode)[0] == 96  # the same prompt again hits at its end


def test_a_prompt_ending_on_a_boundary_serves_the_boundary_its_repeat_can_hit():
    """A 96-token prompt: a consumer with the same prompt takes the whole-prompt hit at 96,
    restoring tokens [0, 95) and computing token 95; ``end`` serves 96 (sliding chunk 5
    holds the window of both hits, 95 and 96) and 80, the last boundary below the last
    token, where native offloading serves a longer prompt (sliding chunk 4)."""
    h = Harness(LAYOUT)
    doc = A[:96]
    assert run(h, "a", doc, "end") == (0, {0: [0, 1, 2, 3, 4, 5], 1: [4, 5]})
    assert run(h, "a2", doc, "end") == (95, {})  # everything it needs is stored
    # a longer prompt sharing all 96 tokens hits at 96 from the same chunks
    assert run(h, "b", [*doc, 7, 8], "end") == (96, {})


@pytest.mark.parametrize("mode", ["end", "shared"])
def test_full_attention_only_layouts_store_the_same_chunks_in_every_mode(mode: str):
    full = Layout((Group("full", 16),))
    dense, pruned = Harness(full), Harness(full)
    for rid, tokens in (("a", A), ("b", B), ("c", C)):
        assert run(pruned, rid, tokens, mode) == run(dense, rid, tokens, "dense")


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="dense, end, shared"):
        RequestLimits(boundaries="stride")  # type: ignore[arg-type]
