"""The hierarchy over every stack of lower tiers: write-back on host eviction (with the
victim's bytes, though its slot is reused at once), promotion reported as WRITING then
READY, cached misses, write-through, disk-to-Redis demotion, removal, and faults below
that never reach the engine."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from tier_helpers import GEOMETRY, SLOT, Clock, ControlledWriter, key, payload

from kvtier.keys import ChunkKey
from kvtier.store import ChunkState, ChunkStore, StoreHandle
from kvtier.tiers.config import WritePolicy
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.host import HostSlab
from kvtier.tiers.lower import LowerTier
from kvtier.tiers.records.format import HEADER_BYTES
from kvtier.tiers.redis.tier import RedisTier
from kvtier.tiers.tiered import Placement, TieredStore

A, W, R = ChunkState.ABSENT, ChunkState.WRITING, ChunkState.READY
Stack = Callable[..., TieredStore]


@pytest.fixture(params=["disk", pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("disk+redis", marks=pytest.mark.redis),
                        pytest.param("disk+cluster", marks=pytest.mark.redis)])
def make_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """Builds TieredStores of 2 host slots over one stack of lower tiers (each in turn);
    ``cluster`` is a Redis Cluster, in a namespace of this test's own."""
    made: list[TieredStore] = []
    names = str(request.param).split("+")
    server = request.getfixturevalue("redis_server") if "redis" in names else None
    cluster = request.getfixturevalue("shared_cluster") if "cluster" in names else None
    namespace = f"h{uuid.uuid4().hex[:12]}"

    def build(write_policy: WritePolicy = "write-back", disk_chunks: int = 16,
              clock: Clock | None = None, writer: ControlledWriter | None = None,
              placement: Placement = "inclusive") -> TieredStore:
        lower: list[LowerTier] = []
        if "disk" in names:
            lower.append(DiskTier(tmp_path / "disk", disk_chunks * (HEADER_BYTES + SLOT), SLOT,
                                  geometry=GEOMETRY, writer=writer))
        if server is not None:
            lower.append(RedisTier(server.url, geometry=GEOMETRY, timeout_s=0.5))
        if cluster is not None:
            lower.append(RedisTier(cluster_nodes=cluster.startup_nodes, namespace=namespace,
                                   geometry=GEOMETRY, timeout_s=0.5))
        host = ChunkStore(backend=HostSlab(2, SLOT, pin_memory=False))
        store = TieredStore(host, lower, write_policy=write_policy, placement=placement,
                            clock=clock or Clock())
        made.append(store)
        return store

    yield build
    for s in made:
        s.close()


def store_chunk(store: TieredStore, name: str) -> int:
    """Store chunk ``name`` as the data plane would: reserve, write the slot, publish."""
    handle = store.prepare_store([key(name)])
    assert isinstance(handle, StoreHandle) and handle.keys == (key(name),)
    store.backend.write(handle.slots[0], payload(name))
    store.complete_store(handle, ok=True)
    return handle.slots[0]


def host_bytes(store: TieredStore, name: str) -> bytes:
    load = store.prepare_load([key(name)])
    try:
        return store.backend.read(load.slots[0])
    finally:
        store.complete_load(load)


def promote(store: TieredStore, names: Sequence[str]) -> list[ChunkState]:
    """Lookup (starting promotions) and wait for them, as a planner answering WAIT would,
    until nothing is WRITING (a bounded number of rounds)."""
    states = store.lookup(keys_of(names))
    assert states == [W] * len(names), states
    for _ in range(3):
        assert store.flush()
        states = store.lookup(keys_of(names))
        if W not in states:
            break
    return states


def test_write_back_copies_the_victim_before_its_slot_is_reused(make_stack: Stack) -> None:
    store = make_stack()
    slot_a = store_chunk(store, "a")
    store_chunk(store, "b")
    handle = store.prepare_store([key("c")])  # evicts a (LRU)
    assert isinstance(handle, StoreHandle) and handle.slots == (slot_a,)
    store.backend.write(handle.slots[0], payload("c"))  # a's slot now holds c's bytes
    store.complete_store(handle, ok=True)
    assert store.flush()
    first = store.lower[0]
    assert bytes(first.get([key("a")])[key("a")]) == payload("a")
    assert first.get([key("b"), key("c")]) == {}  # write-back writes only on eviction
    store.check_invariants()


def test_a_lower_hit_is_promoted_then_loaded(make_stack: Stack) -> None:
    store = make_stack()
    for n in "abc":
        store_chunk(store, n)
    assert promote(store, "a") == [R]  # WRITING (the planner waits), then READY
    assert host_bytes(store, "a") == payload("a")
    stats = store.stats()
    assert stats[store.lower[0].name]["promoted"] == 1 and stats["host"]["hits"] == 1
    store.check_invariants()


@pytest.mark.parametrize("placement", ["inclusive", "exclusive"])
def test_placement_decides_whether_a_promoted_chunk_stays_below(
    make_stack: Stack, placement: Placement
) -> None:
    store = make_stack(placement=placement)
    for n in "abc":
        store_chunk(store, n)
    assert store.flush() and promote(store, "a") == [R]
    assert store.flush()
    below = {t.name: bool(t.get([key("a")])) for t in store.lower}
    assert below[store.lower[0].name] is (placement == "inclusive"), below
    store.check_invariants()


def test_a_promotion_never_evicts_the_lookups_own_chunks(make_stack: Stack) -> None:
    store = make_stack()
    for n in "abc":  # host holds b and c, a went below
        store_chunk(store, n)
    assert store.flush()
    asked = keys_of("bca")
    assert store.lookup(asked) == [R, R, W]
    assert store.flush()
    assert store.lookup(asked) == [R, R, A]  # no room for a but b's or c's slot
    assert bytes(store.lower[0].get([key("a")])[key("a")]) == payload("a")  # still below


def test_a_chunk_found_nowhere_is_absent_until_the_miss_expires(make_stack: Stack) -> None:
    clock = Clock()
    store = make_stack(clock=clock)
    first = store.lookup([key("nowhere")])
    assert store.flush()
    assert store.lookup([key("nowhere")]) == [A]
    if first == [W]:  # a tier that had to be asked (Redis) is asked again only later
        clock.now += 1.5
        assert store.lookup([key("nowhere")]) == [W]
        assert store.flush()


def test_write_through_writes_every_tier_at_store_time(make_stack: Stack) -> None:
    store = make_stack(write_policy="write-through")
    store_chunk(store, "a")
    assert store.flush()
    for tier in store.lower:
        assert bytes(tier.get([key("a")])[key("a")]) == payload("a"), tier.name
    store_chunk(store, "b")
    store_chunk(store, "c")  # evicts a: nothing more to write
    assert store.flush() and promote(store, "a") == [R]
    assert all(t.stats.stored == 3 for t in store.lower)  # promoted a was not written again


def test_remove_drops_every_copy(make_stack: Stack) -> None:
    store = make_stack(write_policy="write-through")
    store_chunk(store, "a")
    assert store.flush()
    assert store.remove([key("a")]) == [key("a")]
    assert store.flush()
    assert all(t.get([key("a")]) == {} for t in store.lower)


def test_many_chunks_cycle_through_a_small_host(make_stack: Stack) -> None:
    store = make_stack()
    names = [f"n{i}" for i in range(8)]
    for n in names:
        store_chunk(store, n)
    assert store.flush()
    for n in names[:6]:  # each promotion evicts (and writes back) another chunk
        assert promote(store, [n]) == [R], n
        assert host_bytes(store, n) == payload(n)
    store.check_invariants()


def test_disk_evictions_are_demoted_to_redis(tmp_path: Path, redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    disk = DiskTier(tmp_path, 2 * (HEADER_BYTES + SLOT), SLOT, geometry=GEOMETRY)
    remote = RedisTier(url, geometry=GEOMETRY)
    host = ChunkStore(backend=HostSlab(1, SLOT, pin_memory=False))
    with TieredStore(host, [disk, remote], clock=Clock()) as store:
        for n in "abcd":  # host holds 1, disk 2: a falls through to Redis
            store_chunk(store, n)
            assert store.flush()
        assert bytes(remote.get([key("a")])[key("a")]) == payload("a")
        assert not disk.might_hold(key("a")) and promote(store, "a") == [R]
        assert host_bytes(store, "a") == payload("a")
        assert store.stats()["redis"]["promoted"] == 1


def test_a_full_disk_refuses_write_back_and_the_host_carries_on(make_stack: Stack) -> None:
    writer = ControlledWriter()
    writer.fail_with = ControlledWriter.disk_full()
    store = make_stack(writer=writer)
    for n in "abcd":
        store_chunk(store, n)
    assert store.flush()
    if isinstance(store.lower[0], DiskTier):
        assert store.stats()["disk"]["refused"] == 2
    assert [s.readable for s in store.lookup([key("c"), key("d")])] == [True, True]
    store.check_invariants()


def keys_of(names: Sequence[str]) -> list[ChunkKey]:
    return [key(n) for n in names]
