"""Admission: a chunk is stored only at its N-th offer within a window of offers; N=1 is
the store without admission, exactly; the filter's memory is fixed by its window."""

from __future__ import annotations

import random
import re
import tracemalloc

import pytest
from store_helpers import key, keys

from kvtier.keys import Namespace
from kvtier.layout import Group, Layout
from kvtier.planner import Outcome, Planner
from kvtier.store import ChunkStore, StoreHandle, StoreRefusal
from kvtier.store.admission import Admission, OfferWindow
from kvtier.store.results import EventLog
from kvtier.tiers.config import TierConfig
from kvtier.tiers.metadata import MetadataTier, NoBytes
from kvtier.tiers.tiered import TieredStore


def offer(store: ChunkStore | TieredStore, names: list[object]) -> StoreHandle:
    handle = store.prepare_store(keys(names))
    assert isinstance(handle, StoreHandle), handle
    store.complete_store(handle, ok=True)
    return handle


def states(store: ChunkStore | TieredStore, names: list[object]) -> list[str]:
    return [s.value for s in store.lookup(keys(names))]


def random_ops(store: ChunkStore, seed: int) -> list[object]:
    """A random mix of stores, loads, touches and removals; every result, in order."""
    rng, out = random.Random(seed), []
    log = EventLog()
    store.subscribe(log)
    for _ in range(400):
        names = [rng.randrange(40) for _ in range(rng.randrange(1, 5))]
        op = rng.random()
        if op < 0.6:
            h = store.prepare_store(keys(names))
            out.append(h)
            if isinstance(h, StoreHandle):
                store.complete_store(h, ok=rng.random() < 0.9)
        elif op < 0.8:
            ready = [k for k, s in zip(keys(names), store.lookup(keys(names)), strict=True)
                     if s.readable]
            if ready:
                store.complete_load(store.prepare_load(ready))
        elif op < 0.9:
            out.append(store.touch(keys(names)))
        else:
            out.append(store.remove(keys(names)))
        out.append(store.lookup(keys(range(40))))
    store.check_invariants()
    return [*out, *log.drain()]


@pytest.mark.parametrize("seed", range(3))
def test_admit_after_1_is_the_store_without_admission(policy_name: str, seed: int) -> None:
    if policy_name == "belady":
        pytest.skip("Belady needs a future")
    plain = random_ops(ChunkStore(8, policy=policy_name), seed)
    admit1 = random_ops(ChunkStore(8, policy=policy_name, admission=Admission(1)), seed)
    assert admit1 == plain
    assert all(h.declined == () for h in admit1 if isinstance(h, StoreHandle))


def test_second_offer_within_the_window_is_stored() -> None:
    store = ChunkStore(4, admission=Admission(after=2, window=3))
    first = offer(store, ["a", "b"])
    assert first.keys == () and first.declined == tuple(keys("ab"))
    assert states(store, ["a", "b"]) == ["absent", "absent"]
    second = offer(store, ["a", "c"])
    assert second.keys == (key("a"),) and second.declined == (key("c"),)
    assert states(store, ["a", "b", "c"]) == ["ready", "absent", "absent"]
    offer(store, ["d", "e"])  # window (3 offers): c d e; b's first offer is forgotten
    assert offer(store, ["b"]).declined == (key("b"),)
    assert offer(store, ["b"]).keys == (key("b"),)
    store.check_invariants()


def test_third_offer_with_admit_after_3() -> None:
    store = ChunkStore(4, admission=Admission(after=3, window=100))
    assert [offer(store, ["a"]).keys for _ in range(3)] == [(), (), (key("a"),)]
    assert offer(store, ["a"]).skipped == (key("a"),)  # held: skipped, not an offer


def test_a_store_refused_for_room_does_not_count_its_offer() -> None:
    store = ChunkStore(1, admission=Admission(after=2, window=10))
    offer(store, ["a"])
    offer(store, ["a"])  # stored
    pin = store.prepare_load(keys("a"))
    offer(store, ["b"])  # first offer of b: declined, counted
    refused = store.prepare_store(keys("b"))  # admitted, but a is pinned: no room
    assert isinstance(refused, StoreRefusal)
    store.complete_load(pin)
    assert offer(store, ["b"]).keys == (key("b"),)  # the retry is the second offer
    store.check_invariants()


def test_promotions_bypass_admission() -> None:
    host = ChunkStore(backend=NoBytes(1), admission=Admission(after=2, window=2))
    tiers = TieredStore(host, [MetadataTier("disk", 8)], miss_ttl_s=0.0)
    for name in ("a", "a", "b", "b"):  # a stored, then evicted to disk by b; the window
        offer(tiers, [name])           # now holds only b's offers
    assert states(tiers, ["a"]) == ["ready"]  # promoted from disk at its lookup
    assert states(host, ["a", "b"]) == ["ready", "absent"]  # b went down to disk
    tiers.check_invariants()


def test_planner_never_hits_a_declined_chunk() -> None:
    layout = Layout((Group("full", 4),))
    store = ChunkStore(100, admission=Admission(after=2))
    planner = Planner(layout, store, Namespace("test"))
    tokens = list(range(13))
    outcomes = []
    for rid in ("r0", "r1", "r2"):
        planner.add_request(rid, tokens)
        found = planner.lookup(rid, 0)
        outcomes.append((found.outcome, found.hit_tokens))
        if found.outcome is Outcome.HIT:
            planner.decline_hit(rid)
        job = planner.on_computed(rid, 13, [list(range(4))])
        if job is not None:
            planner.complete_store(job.id, True)
        planner.finish(rid)
    assert outcomes == [(Outcome.MISS, 0), (Outcome.MISS, 0), (Outcome.HIT, 12)]
    assert planner.metrics.chunks_not_admitted == 3 and planner.metrics.chunks_stored == 3


def test_tier_config_admission_reaches_the_host_store() -> None:
    cfg = TierConfig.from_dict({"host": {"capacity": 4096}, "admit_after": 2,
                                "admit_window": 50})
    assert cfg.admission() == Admission(2, 50)
    assert TierConfig.from_dict({"host": {"capacity": 4096}}).admission() == Admission(1)
    layout = Layout((Group("full", 4, bytes_per_token=16),))
    with TieredStore.from_config(cfg, layout) as tiers:
        assert tiers.host.admission == Admission(2, 50)
        assert offer(tiers, ["a"]).keys == () and offer(tiers, ["a"]).keys == (key("a"),)


def test_filter_memory_is_fixed_by_its_window() -> None:
    fresh = (key(i) for i in range(1_000_000))
    tracemalloc.start()
    try:
        window = OfferWindow(after=2, window=1000)
        assert tracemalloc.get_traced_memory()[0] < 1024  # nothing allocated up front
        for _ in range(3):
            window.record([next(fresh) for _ in range(1000)])
        full = tracemalloc.get_traced_memory()[0]
        for _ in range(30):
            window.record([next(fresh) for _ in range(1000)])
        later = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(window) == window.num_distinct() == 1000
    assert 1000 * 8 < full < 1000 * 200  # the window's fingerprints, about 100 bytes each
    assert later < 1.5 * full  # 30 windows more offers: no more memory
    window.check_invariants()


def test_no_filter_without_admission() -> None:
    assert Admission(1).filter(10**9) is None
    assert Admission(2).filter(10).window == 40  # type: ignore[union-attr]
    assert len(Admission(2).filter(10**9)) == 0  # type: ignore[arg-type]  # nothing up front


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"after": 0}, "admit_after: must be an integer in 1..64, got 0"),
    ({"after": 65}, "admit_after: must be an integer in 1..64"),
    ({"after": True}, "admit_after: must be an integer"),
    ({"after": 2.0}, "admit_after: must be an integer"),
    ({"after": 2, "window": 0}, "admit_window: must be an integer in 1..1073741824, got 0"),
    ({"after": 2, "window": "9"}, "admit_window: must be an integer"),
])
def test_bad_admission_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Admission(**kwargs)  # type: ignore[arg-type]


def test_bad_admission_in_config_and_store() -> None:
    with pytest.raises(ValueError, match=re.escape("admit_after: must be an integer in 1..64")):
        TierConfig.from_dict({"host": {"capacity": 4096}, "admit_after": -1})
    with pytest.raises(ValueError, match="admission must be an Admission, got 2"):
        ChunkStore(4, admission=2)  # type: ignore[arg-type]
