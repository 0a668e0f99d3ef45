"""A quiet step (``ConnectorScheduler.quiet``): most decoding steps plan nothing, and the
connector says so without running ``step``. Driven side by side with a scheduler that
plans every step, through one simulated vLLM (block reuse, sliding-window frees, finishes,
preemption, hits accepted and declined, late and failed reports, a host too small for the
traffic, horizons past the known tokens), it must plan the same jobs at the same steps,
hold the same chunks and report the same metrics; a rule that calls a step quiet where it
is not does not. No vLLM needed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace as NS
from typing import Any

import pytest

from kvtier import coverage
from kvtier.boundaries import BoundaryMode
from kvtier.integrations.vllm.scheduled import continuing_horizons
from kvtier.integrations.vllm.scheduler import NOTHING, ConnectorScheduler, StepPlan, StepRequest
from kvtier.layout import Group, Layout
from kvtier.planner import TransferJob
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
    "swa": Layout((Group("sliding_window", BLOCK, 2, window=8, bytes_per_token=8),)),
}

Horizons = list[tuple[str, int]]
Rule = Callable[[ConnectorScheduler, Horizons], StepPlan | None]


def quiet(sched: ConnectorScheduler, horizons: Horizons) -> StepPlan | None:
    return sched.quiet(horizons)


def every_continuing_step(sched: ConnectorScheduler, horizons: Horizons) -> StepPlan | None:
    """Wrong on purpose: every step without a new block called quiet."""
    return NOTHING


def signature(plan: StepPlan) -> tuple[Any, ...]:
    def jobs(js: tuple[TransferJob, ...]) -> tuple[Any, ...]:
        return tuple((j.id, j.request_id, tuple((c.group, c.chunk, c.block_ids)
                                                for c in j.copies)) for j in js)
    return jobs(plan.loads), jobs(plan.stores), plan.flush, plan.idle


@dataclass
class Sim:
    """One request as the simulated vLLM sees it."""

    tokens: list[int]
    prompt: int = 0  # tokens of the prompt (the rest: generated)
    computed: int = 0
    tables: list[list[int]] = field(default_factory=list)
    state: str = "waiting"  # waiting, loading, loaded, running
    ran: bool = False


def drive(layout: Layout, rule: Rule, seed: int, store: str, slots: int, lag: bool,
          steps: int = 150, boundaries: BoundaryMode = "dense") -> int:
    """Schedulers A (``step`` every step) and B (``rule`` first on continuing steps, as the
    connector does) through the same traffic; asserts they agree at every step and returns
    how many steps B took quiet."""
    rng = random.Random(seed)
    a, b = (ConnectorScheduler(layout, num_slots=slots, num_workers=1, store=store,
                               boundaries=boundaries) for _ in range(2))
    groups = len(layout.groups)
    free = list(range(1, 600))
    rng.shuffle(free)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(8, 60))] for _ in range(4)]
    sims: dict[str, Sim] = {}
    stores_in_flight: dict[int, int] = {}  # job id -> steps until reported
    held: tuple[set[object], set[object]] = set(), set()
    taken = 0
    for step in range(steps):
        if rng.random() < 0.15 and len(sims) < 8:
            rid = f"r{step}"
            tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(12))]
            sims[rid] = Sim(tokens, len(tokens))
            for s in (a, b):
                s.add_request(rid, tokens)
        preempted = []
        for rid, sim in list(sims.items()):
            if sim.state == "running" and rng.random() < 0.03:  # finished
                for s in (a, b):
                    s.finish(rid)
                free.extend(i for t in sim.tables for i in t if i)
                del sims[rid]
            elif sim.state == "running" and rng.random() < 0.02:
                preempted.append(rid)
                free.extend(i for t in sim.tables for i in t if i)
                sim.tables, sim.computed, sim.state = [], 0, "waiting"
        for sim in sims.values():  # vLLM frees blocks that slid out of a window
            for gi, g in enumerate(layout.groups):
                if sim.state == "running" and g.kind != "full":
                    table = sim.tables[gi]
                    for i in range(min(coverage.retained_blocks(g, sim.computed).start,
                                       len(table))):
                        if table[i]:
                            free.append(table[i])
                            table[i] = 0
        new = set()
        for rid, sim in sims.items():
            if sim.state == "loaded":
                sim.state = "running"
                new.add(rid)
            elif sim.state == "waiting" and rid not in preempted and rng.random() < 0.5:
                found = a.lookup(rid, 0, sim.tokens)
                assert b.lookup(rid, 0, sim.tokens) == found
                hit = found[0]
                if hit is None or (hit and rng.random() < 0.25):  # a wait, or declined
                    continue
                if hit:
                    sim.tables = [[free.pop() for _ in range(-(-hit // BLOCK))]
                                  for _ in range(groups)]
                    for s in (a, b):
                        s.after_alloc(rid, sim.tables, hit)
                    sim.computed, sim.state = hit, "loading"
                else:
                    sim.tables, sim.state = [[] for _ in range(groups)], "running"
                    new.add(rid)
        requests, horizons, continuing = [], [], not (new or preempted)
        for rid, sim in sims.items():
            if sim.state != "running":
                continue
            if sim.computed >= len(sim.tokens):
                sim.tokens.append(rng.randrange(50))
            # chunked prefill in uneven pieces: a prompt may end inside a block
            horizon = sim.computed + min(len(sim.tokens) - sim.computed, rng.choice((16, 5, 2)))
            added = [[free.pop() for _ in range(-(-horizon // BLOCK) - len(t))]
                     for t in sim.tables]
            for t, ids in zip(sim.tables, added, strict=True):
                t.extend(ids)
            whole = rid in new
            continuing = continuing and not whole and not any(added)
            tokens = list(sim.tokens)
            if lag and not whole and len(tokens) > sim.prompt and rng.random() < 0.3:
                tokens = tokens[:-1]  # asynchronous scheduling: the horizon runs ahead of
                # the tokens sampled (never of the prompt's: vLLM has them all from the start)
            requests.append(StepRequest(rid, tuple(map(list, sim.tables if whole else added))
                                        if whole or any(added) else None,
                                        whole, horizon, tokens))
            horizons.append((rid, horizon))
        for rid in preempted:
            a.preempt(rid)
        want = a.step(requests)
        for job in want.stores:  # a store reads only blocks its request holds in this step
            tables = sims[job.request_id].tables
            for c in job.copies:
                per = layout.groups[c.group].tokens_per_chunk // BLOCK
                assert list(c.block_ids) == tables[c.group][c.chunk * per : (c.chunk + 1) * per], (
                    f"step {step}: {job.request_id} stores chunk {c.chunk} of group {c.group} "
                    f"from blocks it no longer holds")
        got = rule(b, horizons) if continuing else None
        taken += got is not None
        if got is None:
            for rid in preempted:
                b.preempt(rid)
            got = b.step(requests)
        assert signature(got) == signature(want), f"step {step}"
        done = {}
        for job_id in want.flush:
            if stores_in_flight.pop(job_id, None) is not None:
                done[job_id] = (1, rng.random() > 0.05)
        for job in want.loads:
            done[job.id] = (1, rng.random() > 0.1)
        for job in want.stores:
            stores_in_flight[job.id] = rng.randrange(4)
        for request in requests:
            sims[request.request_id].computed = request.horizon
        for job_id, left in list(stores_in_flight.items()):
            stores_in_flight[job_id] = left - 1
            if not left:
                del stores_in_flight[job_id]
                done[job_id] = (1, rng.random() > 0.05)
        reported = a.on_reports(done)
        assert b.on_reports(done) == reported
        for report in reported:
            sim_ = sims.get(report.request_id)
            if report.direction == "load" and sim_ is not None:
                if report.ok:
                    sim_.state = "loaded"
                else:
                    free.extend(i for t in sim_.tables for i in t if i)
                    sim_.tables, sim_.computed, sim_.state = [], 0, "waiting"
        for s, keys in zip((a, b), held, strict=True):
            for event in s.take_events():
                (keys.add if event.kind is EventKind.STORED else keys.discard)(event.key)
        assert held[0] == held[1], f"step {step}"
        assert a.planner.metrics == b.planner.metrics, f"step {step}"
    return taken


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize(("store", "slots", "lag", "boundaries"), [
    ("all", 64, False, "dense"), ("all", 12, False, "dense"), ("all", 64, True, "dense"),
    ("prompt", 12, False, "dense"), ("all", 64, False, "end"), ("prompt", 64, True, "shared")])
def test_quiet_steps_plan_what_every_step_planning_plans(name: str, store: str, slots: int,
                                                         lag: bool, boundaries: BoundaryMode
                                                         ) -> None:
    taken = sum(drive(LAYOUTS[name], quiet, seed, store, slots, lag, boundaries=boundaries)
                for seed in range(6))
    assert taken > 5  # the fast path ran (a window that frees a block takes a step)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_comparison_fails_for_a_rule_that_skips_a_boundary(name: str) -> None:
    """Negative control: calling every step without a new block quiet puts off the stores
    of boundaries passed in such steps (a request arriving in between misses them)."""
    with pytest.raises(AssertionError, match="step"):
        for seed in range(4):
            drive(LAYOUTS[name], every_continuing_step, seed, "all", 64, False)


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
                                 resumed_req_ids=set(), num_computed_tokens=[10, 20]),
        num_scheduled_tokens={"a": 1, "b": 3}, scheduled_spec_decode_tokens={"b": [7, 8]})
    base.update(fields)
    return NS(**base)


def test_continuing_horizons_read_a_decoding_step_and_refuse_anything_else() -> None:
    # b's two drafts may be rejected: their KV does not count
    assert continuing_horizons(output()) == [("a", 11), ("b", 21)]
    new_block = NS(req_ids=["a"], new_block_ids=[([5],)], resumed_req_ids=set(),
                   num_computed_tokens=[10])
    resumed = NS(req_ids=["a"], new_block_ids=[None], resumed_req_ids={"a"},
                 num_computed_tokens=[10])
    for other in (dict(scheduled_new_reqs=[NS(req_id="c")]), dict(preempted_req_ids={"a"}),
                  dict(kv_cache_block_copies=[NS(dst_block_id=3)]),
                  dict(scheduled_cached_reqs=new_block), dict(scheduled_cached_reqs=resumed),
                  dict(kv_connector_block_state=NS(boundary_state_offloads={"a": [(0, 1, 4)]}))):
        assert continuing_horizons(output(**other)) is None, other


def test_a_step_in_which_a_window_frees_a_block_plans() -> None:
    """vLLM frees a window's blocks as it slides past them; the step in which one is freed
    is planned, not quiet, so that a quiet step never leaves the tables behind a planned
    one's (``TrackedRequest.advance`` forgets the freed blocks there)."""
    sched = ConnectorScheduler(LAYOUTS["swa"], num_slots=64, num_workers=1)  # window 8
    tokens = list(range(30))
    sched.add_request("a", tokens)
    sched.step([StepRequest("a", ([1, 2, 3, 4, 5],), True, 18, tokens)])  # keeps block 2 on
    assert sched.quiet([("a", 19)]) is None  # token 11 leaves the window: block 2 is freed
    sched.step([StepRequest("a", None, False, 19, tokens)])
    assert [sched.quiet([("a", h)]) for h in (20, 21, 22)] == [NOTHING] * 3
    assert sched.quiet([("a", 23)]) is None  # block 3


def test_a_retried_store_reads_no_block_the_window_freed() -> None:
    """A store refused for want of slots is retried in a later step; by then the window may
    have freed some of its blocks (and vLLM may have handed them to another request): those
    chunks are not stored from them. Window 8, 4-token blocks, 8-token chunks."""
    sched = ConnectorScheduler(LAYOUTS["swa"], num_slots=2, num_workers=1)
    a, b = list(range(16)), list(range(100, 130))
    sched.add_request("a", a)
    busy = sched.step([StepRequest("a", ([1, 2, 3, 4],), True, 16, a)])  # both slots
    sched.add_request("b", b)
    assert not sched.step([StepRequest("b", ([11, 12, 13, 14],), True, 16, b)]).stores
    sched.on_reports({job.id: (1, True) for job in busy.stores})  # slots free again
    # b's next step: it has computed 16, so vLLM keeps its blocks from token 9 on (block 2)
    retried = sched.step([StepRequest("b", ([15, 16],), False, 24, b)])
    read = {i for job in retried.stores for c in job.copies for i in c.block_ids}
    assert read == {13, 14, 15, 16}, read  # chunks 1 and 2: blocks 0 and 1 were freed
