"""kvtier's Prometheus metrics over a real hierarchy (host, disk, a real redis-server): each
store call moves exactly the counters it should, and no other, as a scrape of a private
registry shows; and each tier's events carry its name (``subscribe_tiers``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from test_hierarchy import store_chunk
from tier_helpers import GEOMETRY, SLOT, Clock, ControlledWriter, RedisServer, key

from kvtier.keys import Namespace
from kvtier.layout import Group, Layout
from kvtier.metrics import register
from kvtier.metrics.names import TIER_COUNTERS, TIER_HISTOGRAMS
from kvtier.planner import Planner
from kvtier.store import ChunkStore, EventKind, EventLog, StoreEvent, StoreRefusal
from kvtier.tiers.disk.directory import record_path
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.host import HostSlab
from kvtier.tiers.lower import EventSource, subscribe_batches
from kvtier.tiers.records.format import HEADER_BYTES
from kvtier.tiers.redis.tier import RedisTier
from kvtier.tiers.tiered import TieredStore

pytestmark = pytest.mark.redis
TIERS = ("host", "disk", "redis")
Moved = dict[tuple[str, str], float]


@dataclass
class Stack:
    store: TieredStore
    registry: CollectorRegistry
    server: RedisServer

    def counts(self) -> Moved:
        """Every per-tier counter and histogram count, as scraped."""
        names = [m.name for m in TIER_COUNTERS.values()]
        names += [f"{m.name}_count" for m in TIER_HISTOGRAMS.values()]
        return {(n, t): self.registry.get_sample_value(n, {"tier": t}) or 0.0
                for n in names for t in TIERS}

    def moved(self, action: Callable[[], object]) -> Moved:
        """What ``action`` (then the store's background work) moved, by (metric, tier)."""
        before = self.counts()
        action()
        assert self.store.flush()
        after = self.counts()
        return {k: after[k] - before[k] for k in after if after[k] != before[k]}


@pytest.fixture
def make_stack(tmp_path: Path, redis_server: RedisServer) -> Iterator[Callable[..., Stack]]:
    """Host of 2 slots over a disk of ``disk_chunks`` chunks over Redis; write-back."""
    made: list[TieredStore] = []

    def build(disk_chunks: int = 2, writer: ControlledWriter | None = None) -> Stack:
        disk = DiskTier(tmp_path / "disk", disk_chunks * (HEADER_BYTES + SLOT), SLOT,
                        geometry=GEOMETRY, writer=writer)
        clock = Clock()  # stands still: a Redis backoff lasts the whole test
        redis = RedisTier(redis_server.url, geometry=GEOMETRY, timeout_s=0.5, clock=clock)
        host = ChunkStore(backend=HostSlab(2, SLOT, pin_memory=False))
        store = TieredStore(host, [disk, redis], clock=clock)
        made.append(store)
        registry = CollectorRegistry()
        register(store, registry=registry)
        return Stack(store, registry, redis_server)

    yield build
    for s in made:
        s.close()


def load_chunk(store: TieredStore, name: str) -> None:
    store.complete_load(store.prepare_load([key(name)]))


def fill(stack: Stack, names: str) -> None:
    for n in names:
        store_chunk(stack.store, n)
        assert stack.store.flush()


STORED_ON_HOST = {("kvtier_chunks_stored_total", "host"): 1,
                  ("kvtier_store_seconds_count", "host"): 1}


def written_to(tier: str) -> Moved:
    """One chunk written down: Redis counts its whole record (header too), disk its payload."""
    nbytes = SLOT + (HEADER_BYTES if tier == "redis" else 0)
    return {("kvtier_chunks_stored_total", tier): 1, ("kvtier_bytes_stored_total", tier): nbytes,
            ("kvtier_store_seconds_count", tier): 1}


def test_a_store_into_host_memory_moves_the_host_store_counters(make_stack) -> None:
    stack = make_stack()
    assert stack.moved(lambda: store_chunk(stack.store, "a")) == STORED_ON_HOST


def test_a_host_eviction_is_written_back_to_disk(make_stack) -> None:
    stack = make_stack()
    fill(stack, "ab")
    assert stack.moved(lambda: store_chunk(stack.store, "c")) == {
        **STORED_ON_HOST, ("kvtier_evictions_total", "host"): 1, **written_to("disk")}


def test_a_disk_eviction_is_demoted_to_redis(make_stack) -> None:
    stack = make_stack()
    fill(stack, "abcd")  # host c, d; disk a, b: full
    assert stack.moved(lambda: store_chunk(stack.store, "e")) == {
        **STORED_ON_HOST, ("kvtier_evictions_total", "host"): 1, **written_to("disk"),
        ("kvtier_evictions_total", "disk"): 1, **written_to("redis")}


def test_a_promotion_from_disk_then_a_host_hit(make_stack) -> None:
    stack = make_stack(disk_chunks=4)
    fill(stack, "abc")  # a on disk
    moved = stack.moved(lambda: stack.store.lookup([key("a")]))
    assert moved == {
        ("kvtier_hits_total", "disk"): 1, ("kvtier_bytes_loaded_total", "disk"): SLOT,
        ("kvtier_load_seconds_count", "disk"): 1, ("kvtier_promotions_total", "disk"): 1,
        ("kvtier_chunks_stored_total", "host"): 1,  # the promotion, not timed as a store
        ("kvtier_evictions_total", "host"): 1, **written_to("disk")}
    assert stack.moved(lambda: load_chunk(stack.store, "a")) == {
        ("kvtier_hits_total", "host"): 1, ("kvtier_load_seconds_count", "host"): 1}


def test_a_chunk_found_nowhere_is_a_redis_miss(make_stack) -> None:
    stack = make_stack()  # the disk tier knows from its index that it lacks it: no call
    assert stack.moved(lambda: stack.store.lookup([key("x")])) == {
        ("kvtier_misses_total", "redis"): 1, ("kvtier_load_seconds_count", "redis"): 1}


def test_a_full_host_refuses_a_store(make_stack) -> None:
    stack = make_stack()
    fill(stack, "ab")
    pins = [stack.store.prepare_load([key(n)]) for n in "ab"]  # nothing left to evict

    def refused() -> None:
        assert isinstance(stack.store.prepare_store([key("c"), key("d")]), StoreRefusal)

    assert stack.moved(refused) == {("kvtier_refusals_total", "host"): 2}
    for pin in pins:
        stack.store.complete_load(pin)


def test_a_full_disk_refuses_write_back(make_stack) -> None:
    writer = ControlledWriter()
    writer.fail_with = ControlledWriter.disk_full()
    stack = make_stack(writer=writer)
    fill(stack, "ab")
    assert stack.moved(lambda: store_chunk(stack.store, "c")) == {
        **STORED_ON_HOST, ("kvtier_evictions_total", "host"): 1,
        ("kvtier_refusals_total", "disk"): 1, ("kvtier_errors_total", "disk"): 1}


def test_a_corrupt_disk_record_is_counted_and_dropped(make_stack) -> None:
    stack = make_stack(disk_chunks=4)
    fill(stack, "abc")  # a on disk
    path = record_path(Path(stack.store.lower[0].path), key("a"))  # type: ignore[attr-defined]
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + 10)
        f.write(b"\xff\x00\xff")
    moved = stack.moved(lambda: stack.store.lookup([key("a")]))
    assert moved[("kvtier_corrupt_chunks_total", "disk")] == 1
    assert ("kvtier_promotions_total", "disk") not in moved


def test_a_redis_server_that_goes_away_costs_errors_then_skipped_calls(make_stack) -> None:
    stack = make_stack()
    stack.server.stop()
    first = stack.moved(lambda: stack.store.lookup([key("x")]))
    assert first[("kvtier_errors_total", "redis")] == 1
    assert ("kvtier_hits_total", "redis") not in first
    fill(stack, "abcde")  # a disk eviction goes down to Redis, which is backing off
    assert stack.counts()[("kvtier_skipped_calls_total", "redis")] == 1


def test_foreign_entries_in_the_disk_directory_are_counted(tmp_path: Path) -> None:
    chunks = tmp_path / "disk" / "chunks"
    os.makedirs(chunks)
    (chunks / "not-a-chunk").write_bytes(b"hello")
    disk = DiskTier(tmp_path / "disk", 4 * (HEADER_BYTES + SLOT), SLOT, geometry=GEOMETRY)
    store = TieredStore(ChunkStore(backend=HostSlab(2, SLOT, pin_memory=False)), [disk])
    registry = CollectorRegistry()
    register(store, registry=registry)
    with store:
        assert registry.get_sample_value("kvtier_foreign_entries_total", {"tier": "disk"}) == 1


LAYOUT = Layout((Group("full", 16, bytes_per_token=SLOT // 16),))


def test_planner_counters_move_by_what_the_planner_did(tmp_path: Path) -> None:
    store = TieredStore(ChunkStore(backend=HostSlab(4, SLOT, pin_memory=False)))
    planner = Planner(LAYOUT, store, Namespace("m"))  # type: ignore[arg-type]
    registry = CollectorRegistry()
    register(store, planner, registry=registry)
    sample = registry.get_sample_value
    planner.add_request("p", list(range(32)))
    job = planner.on_computed("p", 32, [[1, 2]])
    assert job is not None
    planner.complete_store(job.id, True)
    planner.add_request("q", [*range(32), 7])
    assert planner.lookup("q").hit_tokens == 32
    load = planner.accept_hit("q", [[3, 4, 5]])
    planner.complete_load(load.id, True)
    assert sample("kvtier_planner_chunks_stored_total") == 2
    assert sample("kvtier_planner_bytes_stored_total") == 2 * SLOT
    assert sample("kvtier_planner_chunks_loaded_total") == 2
    assert sample("kvtier_planner_hit_tokens_total", {"tier": "host"}) == 32
    assert sample("kvtier_planner_lookups_total", {"outcome": "hit"}) == 1
    assert sample("kvtier_planner_chunks_offered_by_group_total", {"group": "0"}) == 2
    # the host tier's bytes are the engine's, from the planner
    assert sample("kvtier_bytes_loaded_total", {"tier": "host"}) == 2 * SLOT
    assert sample("kvtier_bytes_stored_total", {"tier": "host"}) == 2 * SLOT
    assert sample("kvtier_hits_total", {"tier": "host"}) == 2


def test_a_missing_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    store = TieredStore(ChunkStore(backend=HostSlab(2, SLOT, pin_memory=False)))
    with pytest.raises(ImportError, match=r"pip install 'kvtier\[metrics\]'"):
        register(store)


def test_subscribe_tiers_tags_each_event_with_its_tier(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path / "disk", 4 * (HEADER_BYTES + SLOT), SLOT, geometry=GEOMETRY)
    with TieredStore(ChunkStore(backend=HostSlab(2, SLOT, pin_memory=False)), [disk]) as store:
        log, batches = EventLog(), []
        stop = store.subscribe_tiers(log)
        stop_batches = store.subscribe_tier_batches(
            lambda tier, kind, ks, slots: batches.append((tier, kind.value, list(ks))))
        for n in "abc":
            store_chunk(store, n)
        assert store.flush()
        seen = [(e.tier, e.kind.value, e.key) for e in log.drain()]
        assert sorted(seen) == sorted([
            ("host", "stored", key("a")), ("host", "stored", key("b")),
            ("host", "evicted", key("a")), ("host", "stored", key("c")),
            ("disk", "stored", key("a"))])
        assert sorted((t, kind, k) for t, kind, ks in batches for k in ks) == sorted(seen)
        stop()
        stop_batches()
        store_chunk(store, "d")
        assert store.flush() and log.drain() == [] and len(batches) == 5


class _OneByOne:
    """A tier of someone else's that publishes events one by one (``EventSource``)."""

    name = "theirs"

    def __init__(self) -> None:
        self.callbacks: list[Callable[[StoreEvent], None]] = []

    def subscribe(self, callback: Callable[[StoreEvent], None]) -> Callable[[], None]:
        self.callbacks.append(callback)
        return lambda: self.callbacks.remove(callback)


def test_a_tier_without_batches_is_subscribed_one_event_a_batch() -> None:
    tier, seen = _OneByOne(), []
    assert isinstance(tier, EventSource)
    stop = subscribe_batches(tier, lambda kind, ks, slots: seen.append((kind, list(ks),
                                                                        list(slots))))
    for callback in tier.callbacks:
        callback(StoreEvent(EventKind.STORED, key("a"), 3, "theirs"))
        callback(StoreEvent(EventKind.EVICTED, key("b"), 4, "theirs"))
    assert seen == [(EventKind.STORED, [key("a")], [3]), (EventKind.EVICTED, [key("b")], [4])]
    stop()
    assert tier.callbacks == []
