"""Random interleavings of requests, steps, completions, failures, aborts and preemptions.

After every step: the store's invariants hold, no pinned chunk was evicted, and every chunk
a load job moves is exactly what the contract says the admitted hit needs and was readable
when the lookup admitted it. At quiescence nothing is left pinned, fenced or in flight.
"""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvtier import coverage
from kvtier.keys import KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.planner import Outcome, Planner
from kvtier.planner.lookup import candidate_hits, common_chunks
from kvtier.store import ChunkStore, EventKind
from strategies import layouts

LAYOUTS = [
    Layout((Group("full", 16), Group("sliding_window", 16, window=32, extra_retained=3))),
    Layout((Group("full", 8, 2), Group("sliding_window", 4, window=10),
            Group("full", 16, lookahead=1))),
    Layout((Group("full", 8), Group("chunked_local", 4, 2, chunk=24))),
]
PREFIXES = [list(range(200)), [*range(40), *range(1000, 1160)], [7] * 200]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class PlannerMachine(RuleBasedStateMachine):
    @initialize(layout=st.sampled_from(LAYOUTS), slots=st.integers(4, 40),
                policy=st.sampled_from(["lru", "arc", "s3fifo"]))
    def setup(self, layout: Layout, slots: int, policy: str) -> None:
        self.layout = layout
        self.clock = Clock()
        self.store = ChunkStore(slots, policy=policy)
        self.planner = Planner(layout, self.store, Namespace("m"), clock=self.clock,
                               wait_timeout_s=1.0)
        self.evicted_while_pinned: list[bytes] = []
        self.store.subscribe(self._on_event)
        self.requests: dict[str, dict] = {}
        self.loads: dict[int, str] = {}
        self.stores: dict[int, str] = {}
        self.pinned: Counter[bytes] = Counter()  # keys of load jobs in flight
        self.load_keys: dict[int, list[bytes]] = {}
        self.n = 0

    def _on_event(self, event) -> None:
        if event.kind is EventKind.EVICTED and self.pinned[event.key] > 0:
            self.evicted_while_pinned.append(event.key)

    def _table(self, num_tokens: int) -> list[list[int]]:
        return [list(range(1000 * gi, 1000 * gi + num_tokens // g.tokens_per_block + 1))
                for gi, g in enumerate(self.layout.groups)]

    @rule(prefix=st.sampled_from(PREFIXES), length=st.integers(1, 120))
    def add(self, prefix: list[int], length: int) -> None:
        self.n += 1
        rid = f"r{self.n}"
        self.planner.add_request(rid, prefix[:length])
        self.requests[rid] = {"tokens": prefix[:length], "horizon": 0, "hit": None,
                              "prefix": prefix}

    def _live(self) -> list[str]:
        return sorted(self.requests)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def lookup(self, data) -> None:
        rid = data.draw(st.sampled_from(self._live()))
        r = self.requests[rid]
        if r["hit"] is not None or r["horizon"]:
            return
        result = self.planner.lookup(rid)
        if result.outcome is not Outcome.HIT:
            return
        chain = KeyChain(self.layout, Namespace("m"), r["tokens"])
        want = []
        for gi, g in enumerate(self.layout.groups):
            want += chain.keys(gi, coverage.load_chunks(g, result.hit_tokens, 0))
        assert all(s.readable for s in self.store.lookup(want))
        if data.draw(st.booleans()):
            job = self.planner.accept_hit(rid, self._table(len(r["tokens"])))
            assert sorted(c.key for c in job.copies) == sorted(want)
            self.loads[job.id] = rid
            self.load_keys[job.id] = [c.key for c in job.copies]
            self.pinned.update(self.load_keys[job.id])
            r["hit"] = job.id
        else:
            self.planner.decline_hit(rid)

    @precondition(lambda self: self.loads)
    @rule(data=st.data(), ok=st.booleans())
    def complete_load(self, data, ok: bool) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.loads)))
        rid = self.loads.pop(job_id)
        self.pinned.subtract(self.load_keys.pop(job_id))
        self.planner.complete_load(job_id, ok)
        if rid in self.requests:
            self.requests[rid]["hit"] = None

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), step=st.integers(1, 80))
    def compute(self, data, step: int) -> None:
        rid = data.draw(st.sampled_from(self._live()))
        r = self.requests[rid]
        if r["hit"] is not None:
            return
        if r["horizon"] + step > len(r["tokens"]):  # decode: the answer grows the request
            extra = r["prefix"][len(r["tokens"]) : r["horizon"] + step]
            self.planner.append_tokens(rid, extra)
            r["tokens"] = r["tokens"] + extra
        r["horizon"] = min(len(r["tokens"]), r["horizon"] + step)
        job = self.planner.on_computed(rid, r["horizon"], self._table(len(r["tokens"])))
        if job is not None:
            self.stores[job.id] = rid

    @precondition(lambda self: self.stores)
    @rule(data=st.data(), ok=st.booleans())
    def complete_store(self, data, ok: bool) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.stores)))
        del self.stores[job_id]
        self.planner.complete_store(job_id, ok)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), how=st.sampled_from(["abort", "finish", "preempt"]))
    def end(self, data, how: str) -> None:
        rid = data.draw(st.sampled_from(self._live()))
        getattr(self.planner, how)(rid)
        if how == "preempt":
            self.requests[rid]["horizon"] = 0
        else:
            del self.requests[rid]

    @rule(dt=st.floats(0, 2))
    def tick(self, dt: float) -> None:
        self.clock.now += dt

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "store"):
            self.store.check_invariants()
            assert not self.evicted_while_pinned

    def teardown(self) -> None:
        if not hasattr(self, "store"):
            return
        for job_id in sorted(self.loads):
            self.planner.complete_load(job_id, True)
        for job_id in sorted(self.stores):
            self.planner.complete_store(job_id, True)
        for rid in list(self.requests):
            self.planner.finish(rid)
        self.planner.check_quiescent()
        self.store.check_invariants()
        assert self.store.num_pinned == 0 and self.store.num_writing == 0


PlannerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
TestPlannerInterleavings = PlannerMachine.TestCase


@settings(max_examples=300)
@given(layouts(), st.integers(1, 300), st.data())
def test_common_chunks_are_loaded_by_every_candidate(layout, prompt, data) -> None:
    """The miss shortcut relies on load ranges only growing with the boundary."""
    on_device_tokens = data.draw(st.integers(0, prompt))
    tpb = math.lcm(*(g.tokens_per_block for g in layout.groups))
    on_device = on_device_tokens // tpb * tpb
    candidates = candidate_hits(layout, prompt, on_device, None)
    if not candidates:
        return
    for g, common in zip(layout.groups, common_chunks(layout, candidates, on_device),
                         strict=True):
        for b in candidates:
            assert set(common) <= set(coverage.load_chunks(g, b, on_device))
