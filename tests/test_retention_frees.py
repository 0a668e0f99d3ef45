"""Where the engine frees a request's blocks (``retention.first_kept_block``) and the next
position at which it frees one more (``retention.retained_moves_at``), against oracles
written from vLLM's own rule: a request that has computed ``b`` tokens keeps no block that
lies wholly before its first kept token (sliding window: ``b - W + 1 - E``; chunked
local: the start of ``b``'s chunk; a state group: ``b - 1``), and keeps every block of a
full-attention group. Then the two closed forms a quiet step compares with
(``retention.admissible_grows_at``, ``TrackedRequest.next_due``) against the rules they
stand for: ``admissible_boundaries`` and the scheduler's own ``_due``.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.integrations.vllm.scheduler import ConnectorScheduler
from kvtier.layout import Group, Layout
from kvtier.retention import (
    NEVER,
    admissible_boundaries,
    admissible_grows_at,
    first_kept_block,
    retained_moves_at,
)
from strategies import groups, layouts


def oracle_first_kept(g: Group, b: int) -> int:
    """The first block not wholly before the first token vLLM keeps at ``b``."""
    if g.kind == "full":
        return 0
    if g.kind == "sliding_window":
        assert g.window is not None
        first_token = max(0, b - g.window + 1 - g.extra_retained)
    elif g.kind == "chunked_local":
        assert g.chunk is not None
        first_token = b // g.chunk * g.chunk
    else:
        first_token = max(0, b - 1)
    return first_token // g.tokens_per_block


@settings(max_examples=400)
@given(groups(), st.integers(0, 400))
def test_first_kept_block_is_vllms(g: Group, b: int) -> None:
    assert first_kept_block(g, b) == oracle_first_kept(g, b)


@settings(max_examples=400)
@given(groups(), st.integers(0, 300))
def test_retained_moves_at_is_the_next_position_that_frees_a_block(g: Group, b: int) -> None:
    first = oracle_first_kept(g, b)
    later = [p for p in range(b + 1, b + 500) if oracle_first_kept(g, p) > first]
    assert retained_moves_at(g, b) == (later[0] if later else NEVER)


def test_worked_examples() -> None:
    window = Group("sliding_window", 4, 1, window=32, extra_retained=3)
    assert first_kept_block(window, 64) == 7  # token 30
    assert retained_moves_at(window, 10) == 38  # token 4 leaves: block 0 is freed
    assert retained_moves_at(window, 64) == 66
    local = Group("chunked_local", 4, 1, chunk=16)
    assert first_kept_block(local, 16) == first_kept_block(local, 31) == 4
    assert retained_moves_at(local, 20) == 32
    assert retained_moves_at(Group("full", 4, 1), 1000) == NEVER


@settings(max_examples=300)
@given(layouts(), st.integers(0, 40), st.integers(0, 400))
def test_admissible_grows_at_is_where_one_more_boundary_is_admissible(
        layout: Layout, count: int, n: int) -> None:
    grows = len(admissible_boundaries(layout, n)) > count
    assert grows == (n >= admissible_grows_at(layout, count))


@settings(max_examples=300)
@given(layouts(), st.integers(1, 200), st.integers(0, 300), st.integers(1, 120),
       st.booleans())
def test_next_due_is_the_first_horizon_the_scheduler_plans_at(
        layout: Layout, prompt: int, prior: int, ahead: int, retry: bool) -> None:
    """``TrackedRequest.next_due`` is the closed form of ``ConnectorScheduler._due`` (the
    rule a planned step applies), for a request planned at ``prior`` (its boundaries
    counted there): due at a horizon exactly when the horizon reaches it."""
    sched = ConnectorScheduler(layout, num_slots=8, num_workers=1)
    sched.add_request("r", list(range(prompt)))
    req = sched._requests["r"]
    req.prior_horizon, req.retry = prior, retry
    req.num_boundaries = len(admissible_boundaries(layout, prior))
    horizon = prior + ahead
    assert sched._due(req, horizon) == (horizon >= req.next_due(layout, ()))
