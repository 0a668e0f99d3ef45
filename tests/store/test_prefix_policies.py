"""Prefix and frequency behaviour of ``pfreq``, and the store's ``parents`` hint, on
hand-worked sequences. The contract suite (test_manager_contract.py) runs against it too."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import key, keys, make_store, store_ok

from kvtier.store import POLICIES, ChunkState, ChunkStore, StoreHandle
from kvtier.store.admission import Admission
from kvtier.store.policies import LRU, PrefixFrequency
from kvtier.store.policies.pfreq import FrequencySketch

R, A = ChunkState.READY, ChunkState.ABSENT


def test_pfreq_is_registered_and_online() -> None:
    assert POLICIES["pfreq"] is PrefixFrequency


def test_tail_goes_before_head_within_a_request() -> None:
    # capacity 4: request a b c, then d needs one slot. LRU takes a (the head, leaving b and
    # c unusable); pfreq takes c (the tail): a b still hit as a prefix.
    p = PrefixFrequency(4)
    p.on_insert(["a", "b", "c"])
    p.on_insert(["d"])
    assert p.victims(2) == ["c", "b"]
    lru = LRU(4)
    lru.on_insert(["a", "b", "c", "d"])
    assert lru.victims(1) == ["a"]


def test_a_child_never_outranks_its_hinted_parent() -> None:
    # a b stored by one request; c (child of b) stored later, alone: without the hint c is
    # the newest key; with it c ranks below b, so c goes first, then b, then a.
    p = PrefixFrequency(8)
    p.on_insert(["a", "b"])
    p.on_insert_with_parents(["c"], ["b"])
    assert p.victims(3) == ["c", "b", "a"]
    q = PrefixFrequency(8)
    q.on_insert(["a", "b"])
    q.on_insert(["c"])  # no hint: batch order only, c is newer than the whole chain
    assert q.victims(1) == ["b"]


def test_an_access_refreshes_the_chain_head_first() -> None:
    # clock one tick per key: x = 1; a = 2, b = min(3, 2 - 1) = 1, c = min(4, 1 - 1) = 0;
    # a hit touches a b: a = 5, b = min(6, 5 - 1) = 4. c, the untouched tail, keeps the
    # rank it got below its parent and goes first, then x, then the chain tail-first.
    p = PrefixFrequency(8)
    p.on_insert(["x"])
    p.on_insert(["a", "b", "c"])
    p.on_access(["a", "b"])
    assert p.victims(4) == ["c", "x", "b", "a"]


def test_frequency_outlives_eviction_when_beta_is_positive() -> None:
    # beta > 0: a key seen twice (before and after its eviction) earns a bonus of about
    # beta * capacity ticks, so it outlives newer keys seen once. (Its return is a miss on
    # a rare ghost, which lowers beta by one step, 8 / (4 * 100) = 0.02.)
    p = PrefixFrequency(100)
    p.beta = 1.0
    p.on_insert(["a"])
    assert p.victims(1) == ["a"]
    p.on_insert(["a"])  # second sight: f = 2, score = 2 + int(0.98 * 100) = 100
    assert p.beta == pytest.approx(0.98)
    p.on_insert(["b"])
    assert p.victims(1) == ["b"]


def test_beta_adapts_to_ghost_hits() -> None:
    p = PrefixFrequency(4)
    p.on_insert(["a"])
    p.on_access(["a"])  # seen twice: evicted as frequent
    assert p.victims(1) == ["a"]
    p.on_insert(["a"])  # a miss on a frequent ghost: frequency was undervalued
    assert p.beta > 0
    raised = p.beta
    p.on_insert(["b"])
    assert p.victims(1) == ["b"]  # b, seen once, is the lowest score
    p.on_insert(["b"])  # a miss on a rare ghost: recency was too short
    assert p.beta < raised
    p.check_invariants()


def test_sketch_halves_after_its_window() -> None:
    s = FrequencySketch(1)  # window 10 increments
    for _ in range(9):
        s.add("a")
    assert s.estimate("a") == 9
    s.add("b")  # the tenth increment halves every count
    assert s.estimate("a") == 4 and s.estimate("b") == 0


def test_store_passes_parents_for_the_new_keys_only() -> None:
    store = ChunkStore(8, policy="pfreq")
    store_ok(store, keys("ab"))
    handle = store.prepare_store(keys("bcd"), parents=[key("a"), key("b"), key("c")])
    assert isinstance(handle, StoreHandle)
    assert handle.keys == tuple(keys("cd")) and handle.parents == (key("b"), key("c"))
    store.complete_store(handle, ok=True)
    assert store.lookup(keys("abcd")) == [R, R, R, R]
    store.check_invariants()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6),
                          st.lists(st.sampled_from("abcdefgh") | st.none(), min_size=6,
                                   max_size=6)), min_size=1, max_size=8),
       st.integers(1, 2))
def test_each_stored_key_gets_its_own_parent(offers: list[tuple[list[str], list[str | None]]],
                                            after: int) -> None:
    """Whatever is skipped (stored before), declined (admission) or offered twice (its last
    parent), a handle's parents are those the hint gave its keys."""
    store = ChunkStore(6, policy="pfreq", admission=Admission(after))
    for names, parent_names in offers:
        parents = [None if n is None else key(n) for n in parent_names[: len(names)]]
        handle = store.prepare_store(keys(names), parents=parents)
        if not isinstance(handle, StoreHandle):
            continue
        given = dict(zip(keys(names), parents, strict=True))  # a key's last parent
        assert handle.parents == tuple(given[k] for k in handle.keys)
        assert handle.parents or not handle.keys
        store.complete_store(handle, ok=True)
    store.check_invariants()


def test_store_without_parents_is_unchanged_for_every_policy(policy_name: str) -> None:
    store = make_store(policy_name, 4, future="abcd")
    handle = store_ok(store, keys("ab"))
    assert handle.parents == ()
    other = store.prepare_store(keys("cd"), parents=[key("b"), None])
    assert isinstance(other, StoreHandle) and other.parents == (key("b"), None)
    store.complete_store(other, ok=True)
    assert store.lookup(keys("abcde")) == [R, R, R, R, A]
    store.check_invariants()


@pytest.mark.parametrize("parents", [[None], [b"short", None], ["a" * 40, None]])
def test_bad_parents_are_refused(parents: list[object]) -> None:
    store = ChunkStore(4, policy="pfreq")
    with pytest.raises(ValueError):
        store.prepare_store(keys("ab"), parents=parents)  # type: ignore[arg-type]
    assert store.num_writing == 0


def test_prefix_hits_beat_lru_on_a_chain_under_pressure() -> None:
    # capacity 3; request 1 stores chain a b c, request 2 stores x; request 3 asks a b c
    # again. LRU evicted a (the head), so nothing of the chain hits; pfreq evicted c.
    def leading_hits(policy: str) -> int:
        store = ChunkStore(3, policy=policy)
        store_ok(store, keys("abc"))
        store_ok(store, keys("x"))
        states = store.lookup(keys("abc"))
        return next((i for i, s in enumerate(states) if s is not R), len(states))

    assert leading_hits("lru") == 0
    assert leading_hits("pfreq") == 2
