"""``AtOncePlanner``'s stores and loads completed within the call equal the two-step calls
(``on_computed`` + ``complete_store``, ``accept_hit`` + ``complete_load``) over a table
holding every block: the same answers, counters and store contents, request after request,
on a hybrid layout with a draft group, small stores (evictions, refusals) and admission."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvtier.keys import KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.planner import Outcome, Planner
from kvtier.planner.at_once import AtOncePlanner
from kvtier.store import ChunkStore
from kvtier.store.admission import Admission

LAYOUT = Layout((Group("full", 4, 2), Group("sliding_window", 4, 2, window=6),
                 Group("full", 4, 2, lookahead=1)))
NS = Namespace("at-once")


def full_table(num_tokens: int) -> list[range]:
    return [range(-(-num_tokens // g.tokens_per_block)) for g in LAYOUT.groups]


def prompt(stem: int, length: int) -> list[int]:
    """Prompts of one of four stems share prefixes as far as their lengths agree."""
    return ([stem] * 8 + list(range(1000)))[:length]


class TwoStep:
    """The reference: every job made and completed by the planner's two-step calls."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def load(self, rid: str, hit_tokens: int) -> list[list[bytes]]:
        job = self.planner.accept_hit(rid, full_table(hit_tokens))
        self.planner.complete_load(job.id, True)
        keys: list[list[bytes]] = [[] for _ in LAYOUT.groups]
        for c in job.copies:
            keys[c.group].append(c.key)
        return keys

    def store(self, rid: str, horizon: int) -> list[tuple[int, int]]:
        job = self.planner.on_computed(rid, horizon, full_table(horizon))
        if job is None:
            return []
        self.planner.complete_store(job.id, True)
        return [(c.group, c.chunk) for c in job.copies]


class AtOnce:
    def __init__(self, planner: AtOncePlanner) -> None:
        self.planner = planner

    def load(self, rid: str, hit_tokens: int) -> list[list[bytes]]:
        return self.planner.load_at_once(rid)

    def store(self, rid: str, horizon: int) -> list[tuple[int, int]]:
        return self.planner.store_at_once(rid, horizon)


REQUEST = st.tuples(st.integers(0, 3), st.integers(1, 90), st.integers(0, 20),
                    st.integers(1, 3))
"""(stem, prompt tokens, decoded tokens, store calls over the whole)."""


def run(side: TwoStep | AtOnce, requests: list[tuple[int, int, int, int]]) -> list[object]:
    """Every answer, request by request."""
    planner, out = side.planner, []
    for i, (stem, n, decoded, calls) in enumerate(requests):
        rid = f"r{i}"
        tokens = prompt(stem, n + decoded)
        planner.add_request(rid, tokens[:n])
        found = planner.lookup(rid, 0)
        loaded = side.load(rid, found.hit_tokens) if found.outcome is Outcome.HIT else []
        planner.append_tokens(rid, tokens[n:])
        stored = [side.store(rid, (n + decoded) * (c + 1) // calls) for c in range(calls)]
        out.append((found.outcome, found.hit_tokens, loaded, stored,
                    planner.request_metrics(rid).as_dict()))
        planner.finish(rid)
    out.append(planner.metrics.as_dict())
    return out


def contents(store: ChunkStore) -> list[object]:
    """The state of every key any request could have stored."""
    keys = [k for stem in range(4) for gi in range(len(LAYOUT.groups))
            for k in KeyChain(LAYOUT, NS, prompt(stem, 110)).keys(gi, range(13))]
    return [s.name for s in store.lookup(keys)]


def stores(slots: int, admit: int) -> tuple[ChunkStore, ChunkStore]:
    admission = Admission(after=admit) if admit > 1 else None
    return (ChunkStore(slots, policy="lru", admission=admission),
            ChunkStore(slots, policy="lru", admission=admission))


@settings(max_examples=150, deadline=None)
@given(st.lists(REQUEST, min_size=1, max_size=12), st.integers(4, 60), st.integers(1, 2))
# a run where a store reserves only the last keys it is offered (the first ones held)
@example([(1, 35, 9, 3), (2, 88, 14, 1), (2, 63, 13, 1), (1, 74, 12, 1), (2, 14, 0, 1),
          (0, 70, 9, 3), (1, 10, 16, 2), (2, 56, 16, 3), (2, 68, 10, 1)], 11, 2)
def test_at_once_equals_the_two_step_calls(requests: list[tuple[int, int, int, int]],
                                           slots: int, admit: int) -> None:
    a, b = stores(slots, admit)
    two_step = run(TwoStep(Planner(LAYOUT, a, NS)), requests)
    at_once = run(AtOnce(AtOncePlanner(LAYOUT, b, NS)), requests)
    assert at_once == two_step
    assert contents(b) == contents(a)


def test_negative_control_a_store_left_incomplete_differs() -> None:
    """The comparison sees a difference: a reference that never completes its stores
    publishes nothing, and its answers and contents differ."""
    requests = [(0, 40, 0, 1), (0, 40, 0, 1)]
    a, b = stores(60, 1)
    planner = Planner(LAYOUT, a, NS)

    class Unfinished(TwoStep):
        def store(self, rid: str, horizon: int) -> list[tuple[int, int]]:
            job = self.planner.on_computed(rid, horizon, full_table(horizon))
            return [] if job is None else [(c.group, c.chunk) for c in job.copies]

    unfinished = run(Unfinished(planner), requests)
    at_once = run(AtOnce(AtOncePlanner(LAYOUT, b, NS)), requests)
    assert at_once[1][0] is Outcome.HIT and unfinished[1][0] is not Outcome.HIT
    assert at_once != unfinished
    assert contents(b) != contents(a)


def test_bad_calls_are_refused_with_what_to_do() -> None:
    planner = AtOncePlanner(LAYOUT, ChunkStore(20), NS)
    planner.add_request("r", prompt(0, 30))
    with pytest.raises(ValueError, match="no hit waiting"):
        planner.load_at_once("r")
    with pytest.raises(ValueError, match="append_tokens first"):
        planner.store_at_once("r", 31)
    with pytest.raises(ValueError, match="token count >= 0"):
        planner.store_at_once("r", -1)
    with pytest.raises(ValueError, match="add_request first"):
        planner.store_at_once("other", 8)
    assert planner.store_at_once("r", 30)  # the request is unharmed
