"""Hand-worked hit/miss sequences per policy, all-or-nothing victims, Belady optimality."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import make_store, simulate

from kvtier.store import ARC, LRU, ONLINE_POLICIES, S3FIFO, Belady, make_policy


def test_lru_hand_worked() -> None:
    # capacity 3: a b c | a hits -> order b c a | d evicts b | b evicts c | e evicts a |
    # a evicts d | c evicts b
    assert simulate(make_store("lru", 3), "abcadbeac") == "MMMHMMMMM"


def test_arc_keeps_a_twice_used_key_that_lru_drops() -> None:
    # capacity 2, trace a a b c a: a moves to T2 on its second use; c evicts b (T1's oldest,
    # |T1| = 1 > p = 0), not a, so the last a hits. LRU evicts a (older than b) instead.
    assert simulate(make_store("arc", 2), "aabca") == "MHMMH"
    assert simulate(make_store("lru", 2), "aabca") == "MHMMM"


def test_arc_adapts_p_on_ghost_hits() -> None:
    # continuing a a b c a with b c a (capacity 2):
    # b: ghost hit in B1 (p 0 -> 1); victim c (|T1| = 1 > p = 0) -> B1 = [c], T2 = [a, b]
    # c: ghost hit in B1 (p 1 -> 2); T1 empty, so victim a (T2's oldest) -> B2 = [a]
    # a: ghost hit in B2 (p 2 -> 1); victim b -> T2 = [c, a]
    store = make_store("arc", 2)
    assert simulate(store, "aabcabca") == "MHMMHMMM"
    assert isinstance(store.policy, ARC) and store.policy.p == 1.0


def test_s3fifo_hand_worked() -> None:
    # capacity 4 (S is "full" as soon as it holds one key, 0.1 * 4 = 0.4):
    # a b c d fill S; a hit (freq 1); e: a moves to M, b (freq 0) evicted to the ghost;
    # b: c evicted, b readmitted from the ghost straight to M; f: d evicted; a hits;
    # g h i evict e f g from S, never touching M; so a and b (in M) both hit. LRU loses b.
    trace = "abcdaebfaghiab"
    assert simulate(make_store("s3fifo", 4), trace) == "MMMMHMMMHMMMHH"
    assert simulate(make_store("lru", 4), trace) == "MMMMHMMMHMMMHM"


def test_s3fifo_main_queue_is_clock() -> None:
    s3 = S3FIFO(4, move_to_main_at=1)
    s3.on_insert(["a", "b", "c", "d"])
    s3.on_access(["a", "b", "c"])
    # S holds all four and is over its 0.4 target: a, b, c are promoted, d is evicted
    assert s3.victims(1) == ["d"]
    # now S is empty: CLOCK over M = [a, b, c], all with count 0 after promotion
    assert s3.victims(2) == ["a", "b"]


def test_belady_hand_worked() -> None:
    # capacity 2, a b c a b: at c, a is next used at 3 and b at 4, so b goes; a hits.
    trace = "abcab"
    assert simulate(make_store("belady", 2, trace), trace) == "MMMHM"
    assert simulate(make_store("lru", 2), trace) == "MMMMM"


@pytest.mark.parametrize("factory", [LRU, ARC, S3FIFO, Belady])
def test_victims_is_all_or_nothing(factory: type) -> None:
    policy = factory(4)
    policy.on_insert(["a", "b", "c", "d"])
    policy.on_access(["b"])
    assert policy.victims(3, protected={"a", "b"}) is None
    assert len(policy) == 4 and all(k in policy for k in "abcd")
    chosen = policy.victims(2, protected={"a", "b"})
    assert sorted(chosen or []) == ["c", "d"]
    assert sorted(policy.resident()) == ["a", "b"]
    policy.check_invariants()


def test_make_policy_rejects_unknown_names_and_options() -> None:
    with pytest.raises(ValueError, match=r"unknown eviction policy 'fifo'.*'arc'.*'lru'"):
        make_policy("fifo", 4)
    with pytest.raises(ValueError, match="bad options"):
        make_policy("lru", 4, future=[])
    with pytest.raises(ValueError, match="capacity must be an integer >= 1"):
        make_policy("arc", 0)
    with pytest.raises(ValueError, match="small_ratio"):
        make_policy("s3fifo", 4, small_ratio=1.5)


traces = st.lists(st.integers(0, 9), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(trace=traces, capacity=st.integers(1, 5))
def test_belady_is_never_beaten(trace: list[int], capacity: int) -> None:
    best = simulate(make_store("belady", capacity, trace), trace).count("H")
    for name in ONLINE_POLICIES:
        assert simulate(make_store(name, capacity), trace).count("H") <= best, name
