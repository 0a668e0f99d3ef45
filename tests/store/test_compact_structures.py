"""``OrderedKeys`` (ARC's lists) against a list model, ``DictWatch`` keeping a churned dict
at a fresh copy's size, and the denser ghost filter S3-FIFO uses."""

from __future__ import annotations

import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.store.policies.ghost import GhostFilter
from kvtier.store.policies.queue import DictWatch, OrderedKeys

ops = st.lists(st.tuples(st.integers(0, 4), st.lists(st.integers(0, 30), max_size=6)),
               max_size=120)


@settings(max_examples=80, deadline=None)
@given(ops=ops)
def test_ordered_keys_agrees_with_a_list(ops: list[tuple[int, list[int]]]) -> None:
    q, other = OrderedKeys(), OrderedKeys()
    model: list[int] = []
    other_model: list[int] = []
    for op, keys in ops:
        if op == 0:  # push absent keys
            new = list(dict.fromkeys(k for k in keys if k not in model and k not in other_model))
            q.push(new)
            model += new
        elif op == 1:  # move from other, by last occurrence
            order = list(reversed(dict.fromkeys(reversed(keys))))
            for k in order:
                if k in model:
                    model.remove(k)
                elif k in other_model:
                    other_model.remove(k)
            q.move_from(other, keys)
            model += order
        elif op == 2 and model:  # pop with some protected
            protected = set(keys)
            free = [k for k in model if k not in protected]
            n = min(len(free), 2)
            expect, passed = free[:n], []
            if n:
                last = model.index(expect[-1])
                passed = [k for k in model[:last] if k in protected]
            assert q.pop_unprotected(n, protected) == expect
            model = [k for k in model if k not in expect and k not in passed] + passed
        elif op == 3 and model:
            q.remove(model.pop(len(keys) % len(model)))
        elif op == 4:
            new = [k for k in dict.fromkeys(keys) if k not in model and k not in other_model]
            other.push(new)
            other_model += new
        assert list(q) == model and len(q) == len(model)
        assert list(other) == other_model
        assert q.live_among(range(31)) == [k for k in range(31) if k in model]


def test_dict_watch_keeps_a_churned_dict_at_a_fresh_size() -> None:
    d: dict[int, None] = dict.fromkeys(range(12_000))
    watch = DictWatch(d)
    for start in range(12_000, 200_000, 16):  # 16 keys in, the 16 oldest out
        for k in range(start - 12_000, start - 12_000 + 16):
            del d[k]
        d.update(dict.fromkeys(range(start, start + 16)))
        d = watch.after_adds(d, 16)
    assert list(d) == list(range(188_000, 200_000))
    # no bigger than a dict built fresh with as many keys
    assert sys.getsizeof(d) <= sys.getsizeof(dict.fromkeys(range(12_000)))


def test_dense_ghost_filter_false_positives_stay_low() -> None:
    # 16 to 32 cells a key (here 18.2, the worst of S3-FIFO's sizes in the store benchmark)
    g = GhostFilter(900, cells_per_key=16)
    for i in range(5000):
        g.add(f"k{i}")
    assert all(f"k{i}" in g for i in range(4100, 5000))
    false_hits = sum(f"new{i}" in g for i in range(20_000))
    assert false_hits < 600  # under 3%
