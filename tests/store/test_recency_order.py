"""LRU's recency order: the pure build's ``KeyQueue`` and the serving build's C
``kvtier._native.KeyOrder`` against a list model, operation by operation; with a negative
control (a model that leaves protected keys in place) showing the comparison can fail,
the C order's bad inputs, and both orders behind a store, evicting the same chunks."""

from __future__ import annotations

import gc
import random
import weakref
from collections.abc import Callable, Hashable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.keys import ChunkKey
from kvtier.store import ChunkStore, StoreHandle
from kvtier.store.policies import queue
from kvtier.store.policies.queue import KeyQueue, RecencyOrder

NATIVE = queue._native


@pytest.fixture(params=["python", "native"])
def make_order(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
               ) -> Iterator[Callable[[], RecencyOrder]]:
    """An order's factory: the pure build's, and the C one where the C module is built
    (``recency_order`` decides which when an order is made)."""
    if request.param == "python":
        monkeypatch.setattr(queue, "_native", None)
    elif NATIVE is None:
        pytest.skip("no kvtier._native in this build (KVTIER_COMPILE=1 builds it)")
    yield queue.recency_order


def test_each_build_makes_its_own_order(make_order: Callable[[], RecencyOrder]) -> None:
    expected = KeyQueue if queue._native is None else NATIVE.KeyOrder
    assert type(make_order()) is expected


class ListModel:
    """The order by definition: a list, oldest first. ``moves_protected=False`` is the
    negative control: protected keys met by a pop stay where they are."""

    def __init__(self, moves_protected: bool = True) -> None:
        self.keys: list[int] = []
        self.moves_protected = moves_protected

    def to_new_end(self, ks: list[int]) -> None:
        for k in ks:
            if k in self.keys:
                self.keys.remove(k)
            self.keys.append(k)

    def take(self, ks: list[int]) -> list[int]:
        found = [k for k in dict.fromkeys(ks) if k in self.keys]
        self.keys = [k for k in self.keys if k not in found]
        return found

    def pop_unprotected(self, n: int, protected: set[int]) -> list[int]:
        chosen = [k for k in self.keys if k not in protected][:n]
        if not chosen:
            return []
        last = self.keys.index(chosen[-1])
        passed = [k for k in self.keys[:last] if k in protected] if self.moves_protected else []
        self.keys = [k for k in self.keys if k not in chosen and k not in passed] + passed
        return chosen


OPS = st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 40), max_size=8)),
               max_size=150)


def run_ops(order: RecencyOrder, model: ListModel, ops: list[tuple[int, list[int]]]) -> int:
    """The operations through both; how many left them disagreeing."""
    wrong = 0
    for op, ks in ops:
        if op == 0:  # push absent keys, each once
            new = [k for k in dict.fromkeys(ks) if k not in model.keys]
            order.push(new)
            model.keys += new
        elif op == 1:  # accesses, a key repeated or absent included
            order.to_new_end(ks)
            model.to_new_end(ks)
        elif op == 2:
            wrong += order.take(ks) != model.take(ks)
        elif op == 3 and model.keys:
            k = model.keys[len(ks) % len(model.keys)]
            order.remove(k)
            model.keys.remove(k)
        elif op == 4:  # victims past protected keys: as many as there are, at most 3
            protected = set(ks)
            n = min(3, len([k for k in model.keys if k not in protected]))
            wrong += order.pop_unprotected(n, protected) != model.pop_unprotected(n, protected)
        elif op == 5:
            wrong += order.live_among(ks) != [k for k in ks if k in model.keys]
        wrong += list(order) != model.keys or len(order) != len(model.keys)
        wrong += any((k in order) != (k in model.keys) for k in range(41))
        if hasattr(order, "check"):
            order.check()
    return wrong


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # a factory: stateless
@given(ops=OPS)
def test_order_agrees_with_the_list_model(make_order: Callable[[], RecencyOrder],
                                          ops: list[tuple[int, list[int]]]) -> None:
    assert run_ops(make_order(), ListModel(), ops) == 0


def test_the_comparison_fails_against_a_wrong_model(
        make_order: Callable[[], RecencyOrder]) -> None:
    ops = [(0, [1, 2, 3, 4, 5]), (4, [1]), (5, [1, 5])]  # leaves [5, 1], not [1, 5]
    assert run_ops(make_order(), ListModel(), ops) == 0
    assert run_ops(make_order(), ListModel(moves_protected=False), ops) > 0


def test_keys_move_between_two_orders(make_order: Callable[[], RecencyOrder]) -> None:
    a, b = make_order(), make_order()
    a.push(["x", "y"])
    b.push(["z"])
    b.move_from(a, ["x", "z", "w", "x"])  # type: ignore[attr-defined]
    assert (list(a), list(b)) == (["y"], ["z", "w", "x"])
    assert (len(a), len(b)) == (1, 3) and "x" not in a and "x" in b


def test_a_long_random_run_of_bytes_keys(make_order: Callable[[], RecencyOrder]) -> None:
    """Store-like keys (40 bytes, equal but not identical objects) through many table
    growths and node reuses."""
    rng = random.Random(7)
    order, model = make_order(), ListModel()
    pool = [rng.randbytes(40) for _ in range(3000)]
    wrong = 0
    for _ in range(400):
        ks = [bytes(pool[rng.randrange(len(pool))]) for _ in range(rng.randrange(1, 40))]
        ops = [(rng.choice([0, 0, 1, 2, 4]), ks)]
        wrong += run_ops(order, model, ops)  # type: ignore[arg-type]
    assert wrong == 0 and len(order) > 100


def test_stores_on_either_order_evict_the_same_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """One random sequence of stores, loads and touches through a store on each order:
    the same states after every step."""
    if NATIVE is None:
        pytest.skip("no kvtier._native in this build (KVTIER_COMPILE=1 builds it)")
    monkeypatch.setattr(queue, "_native", None)
    stores = [ChunkStore(64, policy="lru")]
    monkeypatch.setattr(queue, "_native", NATIVE)
    stores.append(ChunkStore(64, policy="lru"))
    orders = [type(s.policy._order).__name__ for s in stores]  # type: ignore[attr-defined]
    assert orders == ["KeyQueue", "KeyOrder"]
    rng = random.Random(3)
    pool = [ChunkKey(rng.randbytes(40)) for _ in range(300)]
    for _ in range(500):
        ks, storing = rng.sample(pool, rng.randrange(1, 20)), rng.random() < 0.5
        for s in stores:
            if storing:
                handle = s.prepare_store(ks)
                assert isinstance(handle, StoreHandle)
                s.complete_store(handle, ok=True)
            else:
                s.touch(ks)
        assert stores[0].lookup(pool) == stores[1].lookup(pool)
    for s in stores:
        s.check_invariants()


def test_the_c_order_refuses_bad_calls_and_changes_nothing() -> None:
    if NATIVE is None:
        pytest.skip("no kvtier._native in this build (KVTIER_COMPILE=1 builds it)")
    q = NATIVE.KeyOrder()
    q.push([1, 2, 3])
    with pytest.raises(ValueError, match="already in the order"):
        q.push([4, 5, 2])  # 4 and 5 are added first, then taken back
    with pytest.raises(ValueError, match="already in the order"):
        q.push([6, 6])
    with pytest.raises(ValueError, match="fewer than 3 unprotected"):
        q.pop_unprotected(3, {1})
    with pytest.raises(ValueError, match="asked of"):
        q.pop_unprotected(4, ())
    with pytest.raises(KeyError):
        q.remove(9)
    with pytest.raises(TypeError):
        q.push([[1]])  # type: ignore[list-item]  # unhashable
    with pytest.raises(TypeError, match="a sequence of keys"):
        q.push(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a KeyOrder"):
        q.move_from(KeyQueue(), [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes no arguments"):
        NATIVE.KeyOrder(4)  # type: ignore[call-arg]
    q.check()
    assert list(q) == [1, 2, 3]


class Sly:
    """A key whose comparison uses the order it is in."""

    def __init__(self, order: object) -> None:
        self.order = order

    def __hash__(self) -> int:
        return 12345

    def __eq__(self, other: object) -> bool:
        return 1 in self.order  # type: ignore[operator]


def test_a_key_comparison_cannot_use_its_own_order() -> None:
    if NATIVE is None:
        pytest.skip("no kvtier._native in this build (KVTIER_COMPILE=1 builds it)")
    q = NATIVE.KeyOrder()
    q.push([1, Sly(q)])
    with pytest.raises(RuntimeError, match="its own key comparisons"):
        q.to_new_end([Sly(q)])  # same hash as the key inside: compared, which re-enters
    q.check()
    assert len(q) == 2 and 1 in q


def test_the_c_order_lets_go_of_its_keys() -> None:
    if NATIVE is None:
        pytest.skip("no kvtier._native in this build (KVTIER_COMPILE=1 builds it)")

    class Key:
        def __init__(self, order: object) -> None:
            self.order = order  # a cycle through the order: only the GC frees it

    q = NATIVE.KeyOrder()
    k = Key(q)
    q.push([k])
    gone = weakref.ref(k)
    del q, k
    gc.collect()
    assert gone() is None
    h: Hashable = b"x" * 40
    q2 = NATIVE.KeyOrder()
    q2.push([h])
    assert q2.pop_unprotected(1, ()) == [h] and len(q2) == 0
