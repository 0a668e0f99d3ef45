"""The four invariants of the coverage contract, against a brute-force token-walking oracle."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import coverage
from kvtier.layout import Group, Layout
from strategies import groups, layouts

CASES = settings(max_examples=2500)


# -- the oracle: walks token by token, from the definitions in DESIGN section 3 ----------


def kept_tokens(g: Group, b: int) -> set[int]:
    """Positions before b whose KV the engine keeps to continue from b."""
    out = set()
    for p in range(b):
        if g.kind == "full":
            keep = True
        elif g.kind == "sliding_window":
            assert g.window is not None
            keep = p >= b - g.window + 1 - g.extra_retained
        elif g.kind == "chunked_local":
            assert g.chunk is not None
            keep = p // g.chunk == b // g.chunk
        else:
            keep = p == b - 1
        if keep:
            out.add(p)
    return out


def oracle_restore_point(g: Group, b: int) -> int:
    """Where a hit at b restores g up to: b, or for a recomputed draft tail the last chunk
    end whose key (tokens up to the end plus the lookahead) stays before b."""
    if g.draft_tail == "stored":
        return b
    ends = [e for e in range(0, b + 1, g.tokens_per_chunk) if e + g.lookahead <= b]
    return max(ends, default=0)


def oracle_whole_prompt(layout: Layout, n: int) -> bool:
    """Whether a consumer of n tokens can restore all but the last and compute it again: the
    engine then continues from n - 1, keeping kept_tokens(g, n - 1) of every group. No
    chunk it needs may be keyed by a token past n (a stored draft tail at n: n + d > n),
    and a state group must hold the state after token n - 2 (it keeps one per chunk end)."""
    if n < 2:
        return False
    for g in layout.groups:
        if g.draft_tail == "stored" and g.lookahead:
            return False
        if g.kind == "state" and (n - 1) % g.tokens_per_chunk:
            return False
    return True


def oracle_boundaries(layout: Layout, n: int, prompt: int | None = None) -> list[int]:
    d = max((g.lookahead for g in layout.groups if g.draft_tail == "stored"), default=0)
    return [
        b for b in range(1, n + 1)
        if b % layout.hit_granularity == 0 and b + d <= n
        and (prompt is None or b <= prompt - 1
             or (b == prompt and oracle_whole_prompt(layout, prompt)))
    ]


def oracle_hits_served(layout: Layout, b: int) -> list[int]:
    """A producer serving b serves a consumer knowing more tokens (hit at b), and one whose
    tokens end at b (its whole-prompt hit, at b - 1)."""
    return [b - 1, b] if oracle_whole_prompt(layout, b) else [b]


def oracle_required(g: Group, b: int) -> set[int]:
    return {p // g.tokens_per_chunk for p in kept_tokens(g, oracle_restore_point(g, b))}


def oracle_served_required(layout: Layout, g: Group, b: int) -> set[int]:
    out: set[int] = set()
    for h in oracle_hits_served(layout, b):
        out |= oracle_required(g, h)
    return out


def oracle_store(layout: Layout, gi: int, horizon: int) -> set[int]:
    out: set[int] = set()
    for b in oracle_boundaries(layout, horizon):
        out |= oracle_served_required(layout, layout.groups[gi], b)
    return out


def loaded_blocks(g: Group, runs: tuple[coverage.BlockRun, ...]) -> set[int]:
    return {
        r.chunk * g.blocks_per_chunk + r.first_block + i for r in runs for i in range(r.num_blocks)
    }


# -- properties ------------------------------------------------------------------------


@CASES
@given(layouts(), st.integers(0, 400), st.data())
def test_contract_matches_oracle_and_invariants(layout: Layout, horizon: int, data) -> None:
    bounds = oracle_boundaries(layout, horizon)
    assert list(coverage.admissible_boundaries(layout, horizon)) == bounds
    for gi, g in enumerate(layout.groups):
        stored = coverage.store_set(layout, gi, horizon)
        assert set(stored) == oracle_store(layout, gi, horizon)
        hits = [h for b in bounds for h in oracle_hits_served(layout, b)]
        for b in bounds:
            assert list(coverage.hits_served(layout, b)) == oracle_hits_served(layout, b)
            assert set(coverage.served_chunks(layout, gi, b)) == oracle_served_required(
                layout, g, b)
        for h in hits:
            req = set(coverage.required(g, h))
            assert req == oracle_required(g, h)
            assert req <= set(stored)  # invariant 2: no write-only cache
        # invariant 3: nothing stored that no hit of an admissible boundary needs
        for c in stored:
            assert any(c in coverage.required(g, h) for h in hits)
        if hits:
            b = data.draw(st.sampled_from(hits))
            dev = data.draw(st.integers(0, b // g.tokens_per_block)) * g.tokens_per_block
            runs = coverage.load_set(g, b, dev)
            assert [r.chunk for r in runs] == list(coverage.load_chunks(g, b, dev))
            assert all(r.num_blocks > 0 for r in runs)
            # invariant 1: the load never asks for a chunk the lookup did not check
            assert {r.chunk for r in runs} <= set(coverage.required(g, b))
            tpb = g.tokens_per_block
            want = {p // tpb for p in kept_tokens(g, oracle_restore_point(g, b)) if p >= dev}
            assert loaded_blocks(g, runs) == want


@CASES
@given(groups(), st.integers(0, 300))
def test_allocator_keeps_exactly_retained_blocks(g: Group, b: int) -> None:
    """Invariant 4, at every position (not only boundaries)."""
    want = {p // g.tokens_per_block for p in kept_tokens(g, b)}
    assert set(coverage.retained_blocks(g, b)) == want
    span = coverage.retained(g, b)
    assert set(range(span.start, span.end)) == kept_tokens(g, b)


@settings(max_examples=600)
@given(layouts(), st.lists(st.integers(0, 120), min_size=1, max_size=6))
def test_store_delta_sums_to_store_set(layout: Layout, steps: list[int]) -> None:
    horizons = [0]
    for s in steps:
        horizons.append(horizons[-1] + s)
    for gi in range(len(layout.groups)):
        seen: set[int] = set()
        for old, new in itertools.pairwise(horizons):
            delta = set(coverage.store_delta(layout, gi, old, new))
            assert not delta & seen
            want = set(coverage.store_set(layout, gi, new)) - set(
                coverage.store_set(layout, gi, old)
            )
            assert delta == want
            seen |= delta
        assert seen == set(coverage.store_set(layout, gi, horizons[-1]))


@settings(max_examples=300)
@given(layouts(), st.integers(1, 300), st.integers(1, 300))
def test_consumer_boundaries_capped_below_prompt(layout: Layout, n: int, prompt: int) -> None:
    got = list(coverage.admissible_boundaries(layout, n, num_prompt_tokens=prompt))
    assert got == oracle_boundaries(layout, n, prompt)
    assert all(b <= prompt - 1 or coverage.whole_prompt_hit(layout, prompt) for b in got)
    assert coverage.whole_prompt_hit(layout, prompt) == oracle_whole_prompt(layout, prompt)


@settings(max_examples=500)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=8),
       st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=8))
def test_chunk_ranges_set_algebra(a, b) -> None:
    ra, rb = coverage.ChunkRanges.of(a), coverage.ChunkRanges.of(b)
    sa = {c for lo, hi in a for c in range(lo, hi)}
    sb = {c for lo, hi in b for c in range(lo, hi)}
    assert set(ra) == sa and len(ra) == len(sa)
    assert set(ra.union(rb)) == sa | sb
    assert set(ra.minus(rb)) == sa - sb
    assert all((c in ra) == (c in sa) for c in range(-1, 62))


@settings(max_examples=400)
@given(layouts(), st.integers(0, 160), st.data())
def test_stored_blocks_cover_every_block_a_hit_loads(layout: Layout, horizon: int, data) -> None:
    """The producer copies, of each stored chunk, every block any consumer may load."""
    bounds = oracle_boundaries(layout, horizon)
    hits = [h for b in bounds for h in oracle_hits_served(layout, b)]
    for gi, g in enumerate(layout.groups):
        for c in coverage.store_set(layout, gi, horizon):
            run = coverage.store_blocks(layout, gi, c)
            held = loaded_blocks(g, (run,))
            for h in hits:
                for r in coverage.load_set(g, h):
                    if r.chunk == c:
                        assert loaded_blocks(g, (r,)) <= held
            # and every block it copies is live when the producer stores it, in the step
            # that reaches the chunk's first boundary: it holds the blocks of the first hit
            # that needs the chunk and those it computed, up to the boundary
            first = next(b for b in bounds if c in coverage.served_chunks(layout, gi, b))
            h = next(h for h in oracle_hits_served(layout, first) if c in oracle_required(g, h))
            low = coverage.restored_blocks(g, h).start
            assert held <= set(range(low, -(-first // g.tokens_per_block)))


@CASES
@given(layouts(), st.integers(0, 300))
def test_a_recomputed_draft_tail_never_needs_a_key_past_the_boundary(
    layout: Layout, b: int
) -> None:
    """Every chunk of a recomputed draft tail that a hit at ``b`` needs is keyed by tokens
    before ``b`` only; and the engine allocates exactly the blocks it restores."""
    for g in layout.groups:
        if g.draft_tail == "recomputed":
            for c in coverage.required(g, b):
                assert (c + 1) * g.tokens_per_chunk + g.lookahead <= b
        assert coverage.restore_point(g, b) == oracle_restore_point(g, b)
        restored = set(coverage.restored_blocks(g, b))
        want = {p // g.tokens_per_block for p in kept_tokens(g, oracle_restore_point(g, b))}
        assert restored == want


# -- served subsets: a producer may serve any subset of the admissible boundaries --------


@CASES
@given(layouts(), st.integers(0, 400), st.data())
def test_served_subsets_keep_invariants_2_and_3(layout: Layout, horizon: int, data) -> None:
    bounds = oracle_boundaries(layout, horizon)
    served = sorted(data.draw(st.sets(st.sampled_from(bounds))) if bounds else set())
    extra = data.draw(st.integers(0, 3)) * layout.hit_granularity  # past the horizon: ignored
    passed = served + ([bounds[-1] + extra] if bounds and extra else [])
    hits = [h for b in served for h in oracle_hits_served(layout, b)]
    for gi, g in enumerate(layout.groups):
        stored = set(coverage.store_set(layout, gi, horizon, passed))
        want: set[int] = set()
        for b in served:
            want |= oracle_served_required(layout, g, b)
        assert stored == want
        for h in hits:  # invariant 2 for every hit of a served boundary
            assert set(coverage.required(g, h)) <= stored
        for c in stored:  # invariant 3: every stored chunk is needed by a served boundary
            assert any(c in coverage.required(g, h) for h in hits)
        assert coverage.store_set(layout, gi, horizon, bounds) == coverage.store_set(
            layout, gi, horizon
        )
        if not coverage.needs_predecessor(g) or not served:
            continue
        # a full-attention store set is a prefix: it depends on the largest served boundary
        top = served[-1] + layout.max_stored_lookahead
        assert stored == set(coverage.store_set(layout, gi, top))


@settings(max_examples=600)
@given(layouts(), st.integers(0, 300), st.data())
def test_serve_delta_sums_to_store_set(layout: Layout, horizon: int, data) -> None:
    bounds = oracle_boundaries(layout, horizon)
    served = sorted(data.draw(st.sets(st.sampled_from(bounds))) if bounds else set())
    cuts = sorted(data.draw(st.lists(st.integers(0, len(served)), max_size=4)))
    batches = [served[a:b] for a, b in itertools.pairwise([0, *cuts, len(served)])]
    for gi in range(len(layout.groups)):
        seen: set[int] = set()
        done: list[int] = []
        for batch in batches:
            delta = set(coverage.serve_delta(layout, gi, done, batch))
            assert not delta & seen
            done += batch
            assert seen | delta == set(coverage.store_set(layout, gi, horizon, done))
            seen |= delta
        assert seen == set(coverage.store_set(layout, gi, horizon, served))


def test_served_boundaries_must_ascend_through_the_granularity() -> None:
    layout = Layout((Group("full", 16, 1),))
    for bad in ([48, 16], [24], [0], [16, 16]):
        try:
            coverage.store_set(layout, 0, 100, bad)
        except ValueError as e:
            assert "granularity 16" in str(e)
        else:
            raise AssertionError(f"{bad} accepted")
    try:
        coverage.serve_delta(layout, 0, [64], [32])
    except ValueError:
        pass
    else:
        raise AssertionError("a served set that grows below its end was accepted")


def test_served_worked_example() -> None:
    """DESIGN section 3's layout, serving only the prompt end (32)."""
    layout = Layout((Group("full", 16, 1), Group("sliding_window", 4, 1, window=8)))
    assert coverage.store_set(layout, 0, 33, [32]).compact() == "0-1"
    assert coverage.store_set(layout, 1, 33, [32]).compact() == "6-7"
    assert coverage.store_set(layout, 1, 33).compact() == "2-3,6-7"


# -- consumers: the hits a request knowing n tokens may take -----------------------------


def oracle_consumer_hits(layout: Layout, n: int) -> list[int]:
    """Per consumer-admissible boundary b, the tokens restored: b, or n - 1 at b = n."""
    return sorted({min(b, n - 1) for b in oracle_boundaries(layout, n, n)} - {0})


@CASES
@given(layouts(), st.integers(1, 6), st.sampled_from([-1, 0, 1]), st.integers(0, 3))
def test_consumer_hits_one_token_either_side_of_a_boundary(
    layout: Layout, k: int, side: int, extra: int
) -> None:
    """A consumer of n = k*G + side tokens sharing a producer's first n tokens (producer
    horizon n + extra*G, dense): every hit it may take is stored, its chunks are keyed by
    its own tokens only, and the load restores exactly the tokens the engine keeps."""
    n = k * layout.hit_granularity + side
    if n < 1:
        return
    hits = coverage.consumer_hits(layout, n)
    assert hits == oracle_consumer_hits(layout, n)
    whole = n % layout.hit_granularity == 0 and oracle_whole_prompt(layout, n)
    assert (n - 1 in hits) == (whole or (n - 1 > 0 and (n - 1) in oracle_boundaries(
        layout, n, n)))
    horizon = n + extra * layout.hit_granularity
    for gi, g in enumerate(layout.groups):
        stored = set(coverage.store_set(layout, gi, horizon))
        for h in hits:
            need = set(coverage.required(g, h))
            assert need == oracle_required(g, h)
            assert need <= stored  # a cold consumer of the prefix finds it (invariant 2)
            lookahead = g.lookahead if g.draft_tail == "stored" else 0
            assert all((c + 1) * g.tokens_per_chunk + lookahead <= n for c in need)
            tpb = g.tokens_per_block
            want = {p // tpb for p in kept_tokens(g, oracle_restore_point(g, h))}
            assert loaded_blocks(g, coverage.load_set(g, h)) == want
            assert set(coverage.restored_blocks(g, h)) == want  # invariant 4 at the hit


def test_whole_prompt_hit_worked_examples() -> None:
    """Full attention with 64-token chunks: a 256-token prompt repeated restores 255 tokens
    (chunks 0-3); chunked local C = 256: the hit at 255 needs chunks 0-3, which serving 256
    stores; a state group of 64-token chunks has no state after token 254."""
    full = Layout((Group("full", 16, 4),))
    assert coverage.consumer_hits(full, 256) == [64, 128, 192, 255]
    assert coverage.consumer_hits(full, 257) == [64, 128, 192, 256]
    assert coverage.consumer_hits(full, 255) == [64, 128, 192]
    assert list(coverage.required(full.groups[0], 255)) == [0, 1, 2, 3]
    local = Layout((Group("full", 16, 4), Group("chunked_local", 16, 4, chunk=256)))
    assert list(coverage.required(local.groups[1], 256)) == []
    assert list(coverage.served_chunks(local, 1, 256)) == [0, 1, 2, 3]
    assert coverage.store_set(local, 1, 256).compact() == "0-3"
    state = Layout((Group("full", 16, 4), Group("state", 16, 4)))
    assert coverage.consumer_hits(state, 256) == [64, 128, 192]
    assert coverage.hits_served(state, 256) == (256,)
    eagle = Layout((Group("full", 16, 4), Group("full", 16, 4, lookahead=1)))
    assert not coverage.whole_prompt_hit(eagle, 256)
