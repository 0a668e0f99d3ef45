"""Policies allocate for what they hold, not for their capacity (issue 20, item 10).

A policy for 10**9 slots is created in a few hundred bytes; its memory then grows with the
keys reported to it. Measured with tracemalloc (bytes allocated, not time).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from kvtier.store import POLICIES, make_policy
from kvtier.store.policies.ghost import GhostFilter
from kvtier.store.policies.pfreq import FrequencySketch
from kvtier.store.policies.slots import SlotTable

HUGE = 10**9
MiB = 2**20


@contextmanager
def peak_bytes() -> Iterator[Callable[[], int]]:
    """The peak of traced allocations inside the block, read after it."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    result = [0]
    try:
        yield lambda: result[0]
    finally:
        result[0] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_policy_for_a_billion_slots_is_small(name: str) -> None:
    with peak_bytes() as peak:
        policy = make_policy(name, HUGE)
    assert peak() < MiB, f"{name}: {peak()} bytes at creation"
    assert policy.capacity == HUGE and len(policy) == 0


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_memory_grows_with_keys_stored_not_capacity(name: str) -> None:
    keys = [i.to_bytes(8, "big") * 5 for i in range(2000)]
    policy = make_policy(name, HUGE)
    with peak_bytes() as peak:
        for i in range(0, len(keys), 100):
            policy.on_insert(keys[i : i + 100])
        policy.on_access(keys[:500])
        victims = policy.victims(300)
    assert victims is not None and len(policy) == 1700
    assert peak() < 2 * MiB, f"{name}: {peak()} bytes for 2000 keys"  # ~1 KiB a key at most


def test_ghost_filter_remembers_exactly_what_it_did_before_densifying() -> None:
    """Sparse (10**9 keys' table, never densified) and dense (a small table) filters
    remember the same recent adds, and a huge one grows with its adds."""
    keys = [f"k{i}" for i in range(5000)]
    with peak_bytes() as peak:
        huge = GhostFilter(HUGE)
        huge.add_all(keys, [i & 1 for i in range(len(keys))])
    small = GhostFilter(5000)
    small.add_all(keys, [i & 1 for i in range(len(keys))])
    assert all(k in huge for k in keys) and all(k in small for k in keys)
    assert huge.counts() == small.counts() == (2500, 2500)
    assert [m for _, m in huge.pop_all(keys[:10])] == [i & 1 for i in range(10)]
    assert peak() < 3 * MiB, f"{peak()} bytes for 5000 ghosts"  # not 32 GiB of cells
    huge.check_invariants()


def test_frequency_sketch_and_slot_table_grow_lazily() -> None:
    with peak_bytes() as peak:
        sketch, table = FrequencySketch(HUGE), SlotTable(HUGE)
    assert peak() < 64 * 1024
    assert sketch.add_all(["a", "a", "b"]) == [1, 2, 1] and sketch.estimate("a") == 2
    assert table.add_all(["x", "y"]) == [0, 1] and table.find("y") == 1
    table.remove_slot(0)
    assert table.add("z") == 0 and sorted(table) == ["y", "z"]
    table.check_invariants()
