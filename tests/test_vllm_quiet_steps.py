"""A quiet step (``ConnectorScheduler.quiet``): most decoding steps plan nothing, and the
connector says so without running ``step``. Driven side by side with a scheduler that
plans every step, it must plan the same stores at the same steps, and leave the same chunks
stored; a rule that calls a step quiet where it is not does not. No vLLM needed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace as NS

import pytest

from kvtier.integrations.vllm.scheduled import continuing_horizons
from kvtier.integrations.vllm.scheduler import NOTHING, ConnectorScheduler, StepPlan, StepRequest
from kvtier.layout import Group, Layout
from kvtier.store.results import EventKind

BLOCK = 4  # tokens per block; chunks of two blocks

LAYOUTS = {
    "full": Layout((Group("full", BLOCK, 2, bytes_per_token=8),)),
    "full+swa": Layout((Group("full", BLOCK, 2, bytes_per_token=8),
                        Group("sliding_window", BLOCK, 2, window=8, bytes_per_token=8))),
    "swa+mtp": Layout((Group("full", BLOCK, 2, bytes_per_token=8),
                       Group("sliding_window", BLOCK, 2, window=8, lookahead=2,
                             bytes_per_token=8))),
    "chunked_local": Layout((Group("full", BLOCK, 2, bytes_per_token=8),
                             Group("chunked_local", BLOCK, 2, chunk=16, bytes_per_token=8))),
}

Planner = Callable[[ConnectorScheduler, list[StepRequest], bool], StepPlan]


def always_plan(sched: ConnectorScheduler, steps: list[StepRequest], new_blocks: bool
                ) -> StepPlan:
    return sched.step(steps)


def quiet_first(sched: ConnectorScheduler, steps: list[StepRequest], new_blocks: bool
                ) -> StepPlan:
    """As the connector does: a step with no new block may be quiet."""
    if not new_blocks:
        plan = sched.quiet([(s.request_id, s.horizon) for s in steps])
        if plan is not None:
            return plan
    return sched.step(steps)


def never_plan_without_new_blocks(sched: ConnectorScheduler, steps: list[StepRequest],
                                  new_blocks: bool) -> StepPlan:
    """Wrong on purpose: every step without a new block called quiet."""
    return NOTHING if not new_blocks else sched.step(steps)


def decode(layout: Layout, planner: Planner, seed: int, store: str = "all"
           ) -> tuple[list[list[tuple[int, int, tuple[int, ...]]]], set[object], int]:
    """Three requests prefilled, then decoded together 1-3 tokens a step (3: a step with
    verified drafts), each block allocated as the horizon needs it. Returns the stores
    planned per step, the keys held at the end, and how many steps were quiet."""
    rng = random.Random(seed)
    sched = ConnectorScheduler(layout, num_slots=512, num_workers=1, store=store)
    groups = len(layout.groups)
    tokens: dict[str, list[int]] = {}
    blocks: dict[str, int] = {}
    horizon: dict[str, int] = {}
    next_block = 1
    planned, quiet, held = [], 0, set[object]()
    for r in range(3):
        rid = f"r{r}"
        tokens[rid] = [rng.randrange(1000) for _ in range(rng.randrange(5, 30))]
        sched.add_request(rid, tokens[rid])
        assert sched.lookup(rid, 0) == (0, False)
        horizon[rid] = 0
        blocks[rid] = 0
    for step in range(60):
        steps, new_blocks = [], False
        for rid in tokens:
            if step == 0:
                h = len(tokens[rid])
            else:
                tokens[rid].extend(rng.randrange(1000) for _ in range(rng.choice((1, 1, 1, 3))))
                h = len(tokens[rid])
            need = -(-h // BLOCK)
            ids = list(range(next_block, next_block + need - blocks[rid]))
            next_block += len(ids)
            blocks[rid], horizon[rid] = need, h
            new_blocks = new_blocks or bool(ids)
            steps.append(StepRequest(rid, tuple(list(ids) for _ in range(groups)) if ids else None,
                                     step == 0, h, list(tokens[rid])))
        plan = planner(sched, steps, new_blocks)
        quiet += plan is NOTHING
        planned.append([(job.copies[0].group, c.chunk, c.block_ids)
                        for job in plan.stores for c in job.copies])
        sched.on_reports({job.id: (1, True) for job in plan.stores})
        for event in sched.take_events():
            (held.add if event.kind is EventKind.STORED else held.discard)(event.key)
    return planned, held, quiet


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("store", ["all", "prompt"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_quiet_steps_plan_what_every_step_planning_plans(name: str, store: str, seed: int
                                                         ) -> None:
    layout = LAYOUTS[name]
    want, want_held, _ = decode(layout, always_plan, seed, store)
    got, got_held, quiet = decode(layout, quiet_first, seed, store)
    assert got == want
    assert got_held == want_held
    assert quiet > 10  # the fast path ran
    # and stores were planned around it: at boundaries while decoding, or the prompt's
    assert sum(map(bool, want)) > 1 if store == "all" else want[0]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_comparison_fails_for_a_rule_that_skips_a_boundary(name: str) -> None:
    """Negative control: planning nothing on every step without a new block puts off the
    stores of boundaries passed in such steps (to the next step that plans: a request
    arriving in between misses them)."""
    want, _, _ = decode(LAYOUTS[name], always_plan, 1)
    got, _, _ = decode(LAYOUTS[name], never_plan_without_new_blocks, 1)
    assert got != want


def test_a_step_with_anything_else_to_do_is_not_quiet() -> None:
    layout = LAYOUTS["full"]
    sched = ConnectorScheduler(layout, num_slots=64, num_workers=1)
    sched.add_request("a", list(range(9)))
    plan = sched.step([StepRequest("a", ([1, 2, 3],), True, 9, list(range(9)))])
    sched.on_reports({plan.stores[0].id: (1, True)})
    assert sched.quiet([("a", 10)]) is NOTHING
    assert sched.quiet([("a", 16)]) is None  # passes the boundary at 16
    assert sched.quiet([]) is None  # an idle step
    assert sched.quiet([("unknown", 10)]) is None
    sched.add_request("b", list(range(9)))
    assert sched.lookup("b", 0) == (8, True)  # a hit offered, not yet accepted or declined
    assert sched.quiet([("a", 10)]) is None


def output(**fields: object) -> NS:
    base: dict[str, object] = dict(
        scheduled_new_reqs=[], preempted_req_ids=set(), kv_cache_block_copies=[],
        scheduled_cached_reqs=NS(req_ids=["a", "b"], new_block_ids=[None, ([],)],
                                 resumed_req_ids=set()),
        num_scheduled_tokens={"a": 1, "b": 3}, scheduled_spec_decode_tokens={"b": [7, 8]})
    base.update(fields)
    return NS(**base)


def test_continuing_horizons_read_a_decoding_step_and_refuse_anything_else() -> None:
    requests = {"a": NS(num_computed_tokens=10), "b": NS(num_computed_tokens=20)}
    # b's two drafts may be rejected: their KV does not count
    assert continuing_horizons(output(), requests) == [("a", 11), ("b", 21)]
    cached = NS(req_ids=["a"], new_block_ids=[([5],)], resumed_req_ids=set())
    for other in (dict(scheduled_new_reqs=[NS(req_id="c")]), dict(preempted_req_ids={"a"}),
                  dict(kv_cache_block_copies=[NS(dst_block_id=3)]),
                  dict(scheduled_cached_reqs=cached),
                  dict(kv_connector_block_state=NS(boundary_state_offloads={"a": [(0, 1, 4)]}))):
        assert continuing_horizons(output(**other), requests) is None, other
