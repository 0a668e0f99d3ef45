"""``prepare_store(now=True)`` is ``prepare_store`` followed by ``complete_store(ok=True)``:
the same handle fields, events, contents and accounting, operation after operation, for
every policy, with parent hints, keys offered twice, skipped and declined keys, refusals
(pinned chunks) and admission; its handle is already completed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import key, keys

from kvtier.store import POLICIES, ChunkStore, HandleError, StoreHandle, StoreRefusal
from kvtier.store.admission import Admission

NAMES = "abcdefghij"
OPS = st.lists(st.one_of(
    st.tuples(st.just("store"), st.lists(st.sampled_from(NAMES), min_size=1, max_size=5),
              st.booleans()),
    st.tuples(st.just("load"), st.lists(st.sampled_from(NAMES), min_size=1, max_size=3),
              st.booleans()),
    st.tuples(st.just("touch"), st.lists(st.sampled_from(NAMES), max_size=3), st.just(False)),
    st.tuples(st.just("remove"), st.lists(st.sampled_from(NAMES), max_size=2), st.just(False)),
), max_size=25)


class Side:
    """A store, its events, and its loads still pinned."""

    def __init__(self, policy: str, slots: int, admit: int, now: bool) -> None:
        admission = Admission(after=admit) if admit > 1 else None
        self.store = ChunkStore(slots, policy=policy, admission=admission)
        self.now, self.events, self.pinned = now, [], []
        self.store.subscribe_batches(
            lambda kind, ks, slots: self.events.append((kind, tuple(ks), tuple(slots))))

    def do(self, op: str, names: list[str], flag: bool) -> object:
        s, ks = self.store, keys(names)
        if op == "store":
            # a hint unlike the batch's own order (pfreq's default), so that it matters
            parents = ([key(NAMES[(NAMES.index(n) + 3) % len(NAMES)]) for n in names]
                       if flag else None)
            if self.now:
                handle = s.prepare_store(ks, parents, now=True)
            else:
                handle = s.prepare_store(ks, parents)
                if isinstance(handle, StoreHandle):
                    s.complete_store(handle, ok=True)
            return handle
        if op == "load":
            ready = [k for k, st_ in zip(ks, s.lookup(ks), strict=True) if st_.readable]
            if not ready:
                return None
            handle = s.prepare_load(ready)
            if flag:  # kept pinned: later stores may be refused
                self.pinned.append(handle)
            else:
                s.complete_load(handle)
            return handle
        if op == "touch":
            return s.touch(ks)
        return s.remove(ks)

    def state(self) -> object:
        s = self.store
        return ([st_.value for st_ in s.lookup(keys(NAMES))], s.num_free, s.num_ready,
                s.num_writing, s.num_pinned, self.events)


def run(policy: str, slots: int, admit: int, ops: list, now: bool) -> list[object]:
    side, out = Side(policy, slots, admit, now), []
    for op, names, flag in ops:
        result = side.do(op, names, flag)
        if isinstance(result, StoreRefusal):
            result = ("refused", result.needed, result.evictable, result.retryable)
        out.append((result, side.state()))
        side.store.check_invariants()
    for handle in side.pinned:  # then new keys one by one: the order the policy evicts in
        side.store.complete_load(handle)
    for i in range(slots):
        out.append((side.do("store", [f"new{i}"], False), side.state()))
    return out


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(POLICIES)), st.integers(2, 6), st.integers(1, 2), OPS)
def test_now_equals_prepare_then_complete(policy: str, slots: int, admit: int,
                                          ops: list) -> None:
    assert run(policy, slots, admit, ops, now=True) == run(policy, slots, admit, ops, now=False)


def test_negative_control_a_store_left_writing_differs() -> None:
    ops = [("store", ["a", "b"], False), ("load", ["a"], False)]
    now = run("lru", 4, 1, ops, now=True)
    side = Side("lru", 4, 1, now=False)
    handle = side.store.prepare_store(keys("ab"))  # never completed
    assert isinstance(handle, StoreHandle)
    assert side.state() != now[0][1]


def test_its_handle_is_already_completed() -> None:
    store = ChunkStore(4)
    handle = store.prepare_store(keys("ab"), now=True)
    assert isinstance(handle, StoreHandle) and handle.keys == tuple(keys("ab"))
    assert [s.value for s in store.lookup(keys("ab"))] == ["ready", "ready"]
    with pytest.raises(HandleError):
        store.complete_store(handle, ok=True)
    with pytest.raises(HandleError):
        store.complete_store(handle, ok=False)
    assert store.lookup([key("a")])[0].readable  # the failed completion changed nothing
    store.check_invariants()
