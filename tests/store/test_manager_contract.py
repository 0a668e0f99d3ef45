"""The store contract, run against every policy: capacity, pins, writes, atomic eviction,
protected keys, events, and random operation sequences checked after every step."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import key, keys, make_store, store_ok

from kvtier.keys import ChunkKey
from kvtier.store import (
    POLICIES,
    ChunkState,
    EventKind,
    EventLog,
    LoadHandle,
    StoreHandle,
    StoreRefusal,
)

A, P, W, R = ChunkState.ABSENT, ChunkState.PINNED, ChunkState.WRITING, ChunkState.READY


def test_store_then_lookup_and_load(policy_name: str) -> None:
    store = make_store(policy_name, 4)
    handle = store_ok(store, keys("ab"))
    assert handle.keys == tuple(keys("ab")) and sorted(handle.slots) == [0, 1]
    assert store.lookup(keys("abc")) == [R, R, A]
    load = store.prepare_load(keys("a"))
    assert load.slots == handle.slots[:1]
    assert store.lookup(keys("ab")) == [P, R]
    store.complete_load(load)
    assert store.lookup(keys("ab")) == [R, R]
    store.check_invariants()


def test_a_load_counts_as_an_access_when_it_completes() -> None:
    """LRU: a load refreshes its chunks at ``complete_load``, after uses made while it was
    pinned (a pinned chunk cannot be evicted meanwhile, so only the later recency counts)."""
    store = make_store("lru", 3)
    store_ok(store, keys("abc"))  # a is the oldest
    load = store.prepare_load(keys("a"))
    store.touch(keys("c"))
    store.touch(keys("b"))
    store.complete_load(load)  # a is now the newest: c, b, a
    store_ok(store, keys("d"))
    assert store.lookup(keys("abcd")) == [R, R, A, R]
    store.check_invariants()


def test_present_and_writing_keys_are_skipped(policy_name: str) -> None:
    store = make_store(policy_name, 4)
    store_ok(store, keys("a"))
    first = store.prepare_store(keys("b"))
    second = store.prepare_store(keys("abcc"))
    assert isinstance(first, StoreHandle) and isinstance(second, StoreHandle)
    assert second.keys == (key("c"),) and set(second.skipped) == set(keys("ab"))
    assert store.lookup(keys("abc")) == [R, W, W]
    store.complete_store(first, ok=True)
    store.complete_store(second, ok=False)
    assert store.lookup(keys("abc")) == [R, R, A]
    assert store.num_free == 2
    store.check_invariants()


def test_capacity_is_never_exceeded_and_pins_hold(policy_name: str) -> None:
    store = make_store(policy_name, 3)
    store_ok(store, keys("abc"))
    load = store.prepare_load(keys("b"))
    for name in "defgh":
        store_ok(store, keys(name))
        assert store.num_ready + store.num_writing <= 3
        assert store.lookup(keys("b")) == [P]
        store.check_invariants()
    store.complete_load(load)


def test_writing_chunks_are_never_evicted(policy_name: str) -> None:
    store = make_store(policy_name, 3)
    store_ok(store, keys("a"))
    writing = store.prepare_store(keys("bc"))
    assert isinstance(writing, StoreHandle)
    assert isinstance(store.prepare_store(keys("d")), StoreHandle)  # evicts a
    assert store.lookup(keys("abcd")) == [A, W, W, W]
    refused = store.prepare_store(keys("e"))
    assert isinstance(refused, StoreRefusal) and refused.retryable
    store.check_invariants()


def test_refused_store_changes_nothing(policy_name: str) -> None:
    store = make_store(policy_name, 3)
    log = EventLog()
    store_ok(store, keys("abc"))
    store.subscribe(log)
    loads = store.prepare_load(keys("ab"))
    before = store.lookup(keys("abcde"))
    refused = store.prepare_store(keys("de"))  # needs 2, only c is evictable
    assert isinstance(refused, StoreRefusal)
    assert (refused.needed, refused.evictable, refused.retryable) == (2, 1, True)
    assert store.lookup(keys("abcde")) == before and log.drain() == []
    store.check_invariants()
    store.complete_load(loads)


def test_protected_keys_are_not_evicted_for_their_own_request(policy_name: str) -> None:
    store = make_store(policy_name, 3, future="abcab")
    store_ok(store, keys("abc"))
    handle = store.prepare_store(keys("abd"))  # a and b are offered: only c may go
    assert isinstance(handle, StoreHandle) and handle.keys == (key("d"),)
    assert store.lookup(keys("abcd")) == [R, R, A, W]
    refused = store.prepare_store(keys("abde"))  # offers a, b (ready), d (writing): no victim
    assert isinstance(refused, StoreRefusal)
    store.check_invariants()


def test_events_in_order(policy_name: str) -> None:
    store = make_store(policy_name, 2)
    log = EventLog()
    unsubscribe = store.subscribe(log)
    store_ok(store, keys("ab"))
    store_ok(store, keys("c"))
    store.remove(keys("c"))
    events = [(e.kind, e.key) for e in log.drain()]
    assert events[:2] == [(EventKind.STORED, key("a")), (EventKind.STORED, key("b"))]
    assert events[2][0] is EventKind.EVICTED and events[2][1] in keys("ab")
    assert events[3:] == [(EventKind.STORED, key("c")), (EventKind.REMOVED, key("c"))]
    unsubscribe()
    store_ok(store, keys("d"))
    assert log.drain() == []


class Batches:
    """A batch subscriber that keeps each call's kind and copies of its keys and slots."""

    def __init__(self) -> None:
        self.calls: list[tuple[EventKind, list[ChunkKey], list[int]]] = []

    def __call__(self, kind: EventKind, ks: Sequence[ChunkKey], slots: Sequence[int]) -> None:
        self.calls.append((kind, list(ks), list(slots)))

    def flat(self) -> list[tuple[EventKind, ChunkKey, int]]:
        return [(kind, k, s) for kind, ks, slots in self.calls
                for k, s in zip(ks, slots, strict=True)]


def test_batch_subscribers_get_each_change_once_with_all_its_chunks(policy_name: str) -> None:
    store = make_store(policy_name, 2, future="abcdabcd")
    log, batches = EventLog(), Batches()
    store.subscribe(log)
    stop = store.subscribe_batches(batches)
    store_ok(store, keys("ab"))
    store_ok(store, keys("cd"))  # a and b evicted by one change
    store.remove(keys("c"))
    store.remove(keys("e"))  # nothing removed: no call
    assert [(kind, len(ks)) for kind, ks, _ in batches.calls] == [
        (EventKind.STORED, 2), (EventKind.EVICTED, 2), (EventKind.STORED, 2),
        (EventKind.REMOVED, 1)]
    assert batches.flat() == [(e.kind, e.key, e.slot) for e in log.drain()]
    stop()
    store_ok(store, keys("e"))
    assert len(batches.calls) == 4 and len(log.drain()) == 1


def test_failed_store_is_never_visible(policy_name: str) -> None:
    store = make_store(policy_name, 2)
    log = EventLog()
    store.subscribe(log)
    handle = store.prepare_store(keys("ab"))
    assert isinstance(handle, StoreHandle)
    store.complete_store(handle, ok=False)
    assert store.lookup(keys("ab")) == [A, A] and store.num_free == 2 and log.drain() == []
    store.check_invariants()


def test_remove_leaves_pinned_and_writing_keys(policy_name: str) -> None:
    store = make_store(policy_name, 4)
    store_ok(store, keys("abc"))
    load = store.prepare_load(keys("a"))
    writing = store.prepare_store(keys("d"))
    assert store.remove(keys("abcd")) == keys("bc")
    assert store.lookup(keys("abcd")) == [P, A, A, W]
    assert store.touch(keys("abcd")) == 1
    store.complete_load(load)
    assert isinstance(writing, StoreHandle)
    store.complete_store(writing, ok=True)
    store.check_invariants()


# ---- random operation sequences ------------------------------------------------------

NAMES = "abcdefgh"
ops = st.lists(
    st.tuples(
        st.sampled_from(["store", "done", "fail", "load", "unload", "touch", "remove"]),
        st.lists(st.sampled_from(NAMES), min_size=1, max_size=3),
        st.integers(0, 7),
    ),
    max_size=40,
)


class Driver:
    """Applies random operations and checks the contract after each."""

    def __init__(self, policy_name: str) -> None:
        self.store = make_store(policy_name, 3, future=NAMES * 4)
        self.log, self.batches = EventLog(), Batches()
        self.store.subscribe(self.log)
        self.store.subscribe_batches(self.batches)
        self.stores: list[StoreHandle] = []
        self.loads: list[LoadHandle] = []

    def apply(self, op: str, names: list[str], pick: int) -> None:
        ks = keys(names)
        states = self.store.lookup(ks)
        if op == "store":
            self._store(ks, states)
        elif op in ("done", "fail") and self.stores:
            self.store.complete_store(self.stores.pop(pick % len(self.stores)), ok=op == "done")
        elif op == "load" and all(s.readable for s in states):
            self.loads.append(self.store.prepare_load(ks))
        elif op == "unload" and self.loads:
            self.store.complete_load(self.loads.pop(pick % len(self.loads)))
        elif op == "touch":
            self.store.touch(ks)
        elif op == "remove":
            self.store.remove(ks)
        self.check()

    def _store(self, ks: list, states: list[ChunkState]) -> None:
        everything = self.store.lookup(keys(NAMES))
        result = self.store.prepare_store(ks)
        if isinstance(result, StoreRefusal):
            assert self.store.lookup(keys(NAMES)) == everything
        else:
            self.stores.append(result)
            ready_offered = [k for k, s in zip(ks, states, strict=True) if s.readable]
            assert all(s.readable for s in self.store.lookup(ready_offered))

    def check(self) -> None:
        self.store.check_invariants()
        assert self.store.num_ready + self.store.num_writing <= 3
        for h in self.loads:
            assert set(self.store.lookup(h.keys)) == {P}
        for h in self.stores:
            assert set(self.store.lookup(h.keys)) <= {W}
        assert self.batches.flat() == [(e.kind, e.key, e.slot) for e in self.log.drain()]
        assert all(ks for _, ks, _ in self.batches.calls)
        self.batches.calls.clear()


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=40, deadline=None)
@given(sequence=ops)
def test_random_operations_keep_the_contract(name: str, sequence: list) -> None:
    driver = Driver(name)
    for op, names, pick in sequence:
        driver.apply(op, names, pick)
