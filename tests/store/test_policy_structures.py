"""The compact structures policies are built from: ``SlotTable`` against a dict,
``GhostFilter``'s window and marks, ``KeyQueue`` with repeated keys."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.store.policies import ARC
from kvtier.store.policies.ghost import GhostFilter
from kvtier.store.policies.queue import KeyQueue
from kvtier.store.policies.slots import SlotTable

ops = st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=200)


@settings(max_examples=80, deadline=None)
@given(ops=ops, capacity=st.integers(1, 12))
def test_slot_table_agrees_with_a_dict(ops: list[tuple[bool, int]], capacity: int) -> None:
    # int keys collide on purpose (hash(i) = i, an index of a few cells): long probe runs,
    # wrap-around and backward-shift deletion all get exercised
    table, model = SlotTable(capacity), {}
    for add, k in ops:
        if add and k not in model and len(model) < capacity:
            model[k] = table.add(k)
        elif not add and k in model:
            table.remove_slot(model.pop(k))
        assert {x: table.find(x) for x in range(41) if table.find(x) is not None} == model
        table.check_invariants()
    assert sorted(table) == sorted(model) and len(table) == len(model)


def test_ghost_filter_remembers_at_least_its_capacity() -> None:
    g = GhostFilter(1000)
    for i in range(5000):
        g.add(f"k{i}", mark=i % 2)
        g.check_invariants()
    assert all(f"k{i}" in g for i in range(4000, 5000))  # the last capacity: never forgotten
    forgotten = sum(f"k{i}" not in g for i in range(2000, 3000))  # two generations ago
    assert forgotten > 980  # all but a few false positives
    marks = [g.pop(f"k{i}") for i in range(4000, 4010)]
    assert marks == [0, 1] * 5
    false_hits = sum(f"new{i}" in g for i in range(10_000))
    assert false_hits < 100  # under 1%: 32 bits a key, two generations


def test_ghost_filter_counts_marks_and_pops() -> None:
    g = GhostFilter(4)
    g.add_all(["a", "b", "c"], [0, 1, 1])
    assert g.counts() == (1, 2) and len(g) == 3
    assert g.pop_all(["b", "x", "a"]) == [("b", 1), ("a", 0)]
    assert g.counts() == (0, 1)


def test_key_queue_take_counts_a_repeated_key_once() -> None:
    q = KeyQueue()
    q.push(["a", "b"])
    assert q.take(["a", "a"]) == ["a"] and len(q) == 1 and list(q) == ["b"]


def test_arc_access_with_a_repeated_key() -> None:
    # a load may name a key twice: ARC moves it from T1 to T2 once
    arc = ARC(2)
    arc.on_insert(["a", "b"])
    arc.on_access(["a", "a"])
    arc.check_invariants()
    assert len(arc) == 2 and arc.victims(1) == ["b"]
