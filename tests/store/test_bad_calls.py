"""Bad calls get clear errors and change nothing; a refused store can be retried."""

from __future__ import annotations

import pytest
from store_helpers import key, keys, store_ok

from kvtier.store import (
    LRU,
    ChunkNotReadyError,
    ChunkState,
    ChunkStore,
    HandleError,
    LoadHandle,
    StoreHandle,
    StoreRefusal,
)


@pytest.mark.parametrize(
    "bad",
    [["a" * 40], [b"short"], [40], [bytearray(40)], [None]],
    ids=["str", "short-bytes", "int", "bytearray", "none"],
)
@pytest.mark.parametrize("method", ["lookup", "prepare_load", "prepare_store", "touch", "remove"])
def test_wrong_key_types_are_rejected(method: str, bad: list) -> None:
    store = ChunkStore(2)
    with pytest.raises(ValueError, match="a chunk key must be 40 bytes"):
        getattr(store, method)(bad)
    store.check_invariants()


def test_a_single_key_instead_of_a_list_is_rejected() -> None:
    with pytest.raises(ValueError, match="not a single key"):
        ChunkStore(2).lookup(key("a"))


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="num_slots must be an integer >= 1"):
        ChunkStore(0)
    with pytest.raises(ValueError, match="exactly one of num_slots"):
        ChunkStore()
    with pytest.raises(ValueError, match="unknown eviction policy 'mru'"):
        ChunkStore(4, policy="mru")
    with pytest.raises(ValueError, match="built for 4 slots"):
        ChunkStore(4, policy=LRU(3))


def test_double_completed_handles_raise_and_change_nothing() -> None:
    store = ChunkStore(2)
    handle = store_ok(store, keys("a"))
    load = store.prepare_load(keys("a"))
    store.complete_load(load)
    with pytest.raises(HandleError, match="already completed"):
        store.complete_load(load)
    with pytest.raises(HandleError, match="not a live store handle"):
        store.complete_store(handle, ok=False)
    assert store.lookup(keys("a")) == [ChunkState.READY]
    store.check_invariants()


def test_foreign_forged_and_wrong_kind_handles_raise() -> None:
    store, other = ChunkStore(2), ChunkStore(2)
    mine = store.prepare_store(keys("a"))
    theirs = other.prepare_store(keys("a"))
    assert isinstance(mine, StoreHandle) and isinstance(theirs, StoreHandle)
    assert mine.id == theirs.id  # same number, different store
    with pytest.raises(HandleError):
        store.complete_store(theirs, ok=True)
    forged = StoreHandle(mine.id, mine.keys, mine.slots, mine.skipped)
    with pytest.raises(HandleError):
        store.complete_store(forged, ok=True)
    with pytest.raises(HandleError, match="not a load handle"):
        store.complete_load(mine)  # type: ignore[arg-type]
    with pytest.raises(HandleError):
        store.complete_load(LoadHandle(999, (), ()))
    assert store.lookup(keys("a")) == [ChunkState.WRITING]
    store.complete_store(mine, ok=True)
    store.check_invariants()


def test_loading_what_is_not_ready_raises_and_pins_nothing() -> None:
    store = ChunkStore(3)
    store_ok(store, keys("a"))
    writing = store.prepare_store(keys("b"))
    with pytest.raises(ChunkNotReadyError, match="1 of 2 keys are not readable"):
        store.prepare_load(keys("ac"))
    with pytest.raises(ChunkNotReadyError, match="writing"):
        store.prepare_load(keys("ab"))
    assert store.num_pinned == 0
    assert isinstance(writing, StoreHandle)
    store.complete_store(writing, ok=True)
    store.check_invariants()


def test_store_refused_when_every_slot_is_pinned_can_be_retried() -> None:
    store = ChunkStore(2)
    store_ok(store, keys("ab"))
    load = store.prepare_load(keys("ab"))
    refused = store.prepare_store(keys("c"))
    assert isinstance(refused, StoreRefusal) and refused.retryable
    assert "retry" in refused.reason and (refused.needed, refused.evictable) == (1, 0)
    assert store.lookup(keys("abc")) == [ChunkState.PINNED, ChunkState.PINNED, ChunkState.ABSENT]
    store.complete_load(load)
    retried = store.prepare_store(keys("c"))
    assert isinstance(retried, StoreHandle) and retried.keys == (key("c"),)
    store.check_invariants()


def test_a_request_larger_than_the_store_is_not_retryable() -> None:
    store = ChunkStore(2)
    refused = store.prepare_store(keys("abc"))
    assert isinstance(refused, StoreRefusal) and not refused.retryable
    assert "has only 2" in refused.reason and store.num_free == 2



@pytest.mark.parametrize("asked", [False, True])
def test_a_load_naming_a_key_twice_pins_it_until_it_completes(asked: bool) -> None:
    """A lone load's pins are counted from its handle when first asked (``asked``: before
    a second load comes); a key it names twice counts once per mention, so releasing it
    while the second load is live leaves exactly that load's key pinned."""
    store = ChunkStore(2)
    store_ok(store, keys("ab"))
    twice = store.prepare_load(keys("aab"))
    if asked:
        assert store.num_pinned == 2
    other = store.prepare_load(keys("b"))
    assert isinstance(store.prepare_store(keys("c")), StoreRefusal)  # a and b pinned
    store.complete_load(twice)
    assert store.num_pinned == 1
    handle = store.prepare_store(keys("c"))  # a is free again, b is not
    assert isinstance(handle, StoreHandle)
    store.complete_store(handle, ok=True)
    assert [s.value for s in store.lookup(keys("abc"))] == ["absent", "pinned", "ready"]
    store.complete_load(other)
    assert store.num_pinned == 0
    store.check_invariants()
