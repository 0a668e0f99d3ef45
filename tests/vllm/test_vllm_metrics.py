"""The connector's metrics on vLLM's stats path: each call hands out increments, never
totals; vLLM's sums over workers and steps are then kvtier's totals; the Prometheus side
adds exactly those, under vLLM's engine labels; a KV event carries its tier's medium."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any, cast

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.distributed.kv_events import BlockRemoved, BlockStored

from kvtier.integrations.vllm.observe import (
    ConnectorStats,
    KvtierPromMetrics,
    KvtierStats,
    RankEvents,
    RankTally,
    TierEventLog,
    kv_event,
)
from kvtier.integrations.vllm.scheduler import ConnectorScheduler, StepRequest
from kvtier.integrations.vllm.worker_tiers import RankTiers
from kvtier.keys import ChunkKey
from kvtier.layout import Group, Layout
from kvtier.store.results import EventKind, StoreEvent
from kvtier.tiers.config import TierConfig
from kvtier.tiers.host import HostSlab
from kvtier.tiers.lower import TierStats

pytestmark = pytest.mark.vllm

LAYOUT = Layout((Group("full", 4, 2, bytes_per_token=8),))  # 8-token chunks of 64 bytes


def produce(sched: ConnectorScheduler, rid: str, prompt: list[int]) -> None:
    """One step computing ``prompt``, its store job reported done by the one worker."""
    sched.add_request(rid, prompt)
    plan = sched.step([StepRequest(rid, ([1, 2, 3, 4, 5],), True, len(prompt), prompt)])
    sched.on_reports({job.id: (1, True) for job in plan.stores})


def test_each_call_hands_out_what_changed_since_the_last() -> None:
    sched = ConnectorScheduler(LAYOUT, 8, 1)
    stats = ConnectorStats.of_scheduler(sched)
    produce(sched, "a", list(range(20)))  # two whole chunks
    first = stats.take()
    assert first["tiers"]["host"] == {"stored": 2, "bytes_written": 128}
    assert first["planner"]["chunks_stored"] == 2
    assert first["planner"]["bytes_stored"] == 128
    assert stats.take() == {}  # nothing happened since
    produce(sched, "c", list(range(100, 120)))
    assert stats.take()["tiers"]["host"] == {"stored": 2, "bytes_written": 128}


def test_each_change_is_reported_by_the_next_take_and_a_quiet_step_by_none() -> None:
    """Each call that moves a counter, alone between two takes (a count missed would never
    reach vLLM once the engine goes idle)."""
    sched = ConnectorScheduler(LAYOUT, 8, 1)
    stats = ConnectorStats.of_scheduler(sched)
    prompt = list(range(20))
    sched.add_request("a", prompt)
    stats.take()
    plan = sched.step([StepRequest("a", ([1, 2, 3, 4, 5],), True, 20, prompt)])
    assert stats.take()["planner"]["chunks_offered"] == 2  # the step planned two stores
    sched.on_reports({plan.stores[0].id: (1, True)})
    assert stats.take()["tiers"]["host"] == {"stored": 2, "bytes_written": 128}
    sched.step([StepRequest("a", None, False, 21, [*prompt, 20])])  # no chunk end passed
    assert stats.take() == {}
    sched.add_request("m", list(range(500, 520)))
    stats.take()
    assert sched.lookup("m", 0) == (0, False)
    assert stats.take() == {"planner": {"lookups": {"miss": 1}}}
    sched.add_request("b", prompt)
    assert sched.lookup("b", 0) == (16, True)
    stats.take()
    sched.after_alloc("b", [[6, 7, 8, 9, 10]], 16)
    load = sched.step([]).loads[0]
    stats.take()
    sched.on_reports({load.id: (1, True)})
    assert stats.take()["planner"]["chunks_loaded"] == 2


def test_a_workers_tier_counts_are_reported_once_each() -> None:
    disk = TierStats("disk")
    stats = ConnectorStats.of_worker(cast(Any, NS(lower=[NS(name="disk", stats=disk)])))
    assert stats is not None
    assert stats.take() == {}
    disk.add(hits=2)
    assert stats.take() == {"tiers": {"disk": {"hits": 2}}}
    assert stats.take() == {}
    disk.add(errors=1)
    assert stats.take() == {"tiers": {"disk": {"errors": 1}}}


def payload(hits: int, samples: list[float]) -> dict[str, Any]:
    return {"tiers": {"disk": {"hits": hits}},
            "planner": {"lookups": {"hit": 1}, "chunks_loaded": hits},
            "latency": {"disk": {"read": samples}}}


def test_stats_sum_across_workers_and_steps() -> None:
    step1 = KvtierStats(data=payload(2, [0.001])).aggregate(KvtierStats(data=payload(3, [0.2])))
    total = step1.aggregate(KvtierStats(data=payload(1, [0.004])))
    assert isinstance(total, KvtierStats)
    assert total.data == {"tiers": {"disk": {"hits": 6}},
                          "planner": {"lookups": {"hit": 3}, "chunks_loaded": 6},
                          "latency": {"disk": {"read": [0.001, 0.2, 0.004]}}}
    assert total.reduce()["tiers.disk.hits"] == 6
    assert total.reduce()["latency.disk.read.count"] == 3
    assert not total.is_empty() and KvtierStats().is_empty()


def private(registry: CollectorRegistry) -> dict[type, type]:
    """vLLM's metric classes, bound to a private registry."""

    def bound(cls: type) -> type:
        return type(cls.__name__, (cls,), {"__init__": lambda self, *a, **k: cls.__init__(
            self, *a, registry=registry, **k)})

    return {Gauge: bound(Gauge), Counter: bound(Counter), Histogram: bound(Histogram)}


class _Config:
    kv_transfer_config = None


def test_prometheus_counters_add_each_steps_increments() -> None:
    registry = CollectorRegistry()
    prom = KvtierPromMetrics(_Config(), private(registry), ["model_name", "engine"],  # type: ignore[arg-type]
                             {0: ["m", "0"]})
    prom.observe(payload(2, [0.001, 0.2]), engine_idx=0)
    prom.observe(payload(3, [0.004]), engine_idx=0)
    labels = {"model_name": "m", "engine": "0"}
    sample = registry.get_sample_value
    assert sample("kvtier_hits_total", {**labels, "tier": "disk"}) == 5
    assert sample("kvtier_planner_chunks_loaded_total", labels) == 5
    assert sample("kvtier_planner_lookups_total", {**labels, "outcome": "hit"}) == 2
    assert sample("kvtier_load_seconds_count", {**labels, "tier": "disk"}) == 3
    assert sample("kvtier_load_seconds_sum", {**labels, "tier": "disk"}) == pytest.approx(0.205)
    assert sample("kvtier_load_seconds_bucket", {**labels, "tier": "disk", "le": "0.001"}) == 1


KEY = ChunkKey(bytes(range(40)))


@pytest.mark.parametrize(("tier", "medium", "locality"), [
    ("host", "CPU", "LOCAL"), ("disk", "STORAGE", "LOCAL"), ("redis", "STORAGE", "REMOTE")])
def test_a_kv_event_carries_its_tiers_medium(tier: str, medium: str, locality: str) -> None:
    stored = kv_event(StoreEvent(EventKind.STORED, KEY, 0, tier), block_size=256)
    removed = kv_event(StoreEvent(EventKind.EVICTED, KEY, 0, tier), block_size=256)
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert (stored.medium, stored.locality, stored.block_hashes) == (medium, locality, [KEY])
    assert (removed.medium, removed.locality, removed.block_hashes) == (medium, locality, [KEY])


def rank_events(*events: tuple[int, EventKind]) -> RankEvents:
    return RankEvents([(rank, StoreEvent(kind, KEY, 0, "disk")) for rank, kind in events])


def test_a_lower_tier_chunk_is_published_once_every_rank_holds_its_shard() -> None:
    tally = RankTally(num_workers=2)
    tally.report(rank_events((0, EventKind.STORED)))
    assert tally.take() == []  # rank 1's shard is not there yet
    tally.report(rank_events((1, EventKind.STORED), (1, EventKind.STORED)))
    assert [e.kind for e in tally.take()] == [EventKind.STORED]
    tally.report(rank_events((1, EventKind.EVICTED)))
    assert [e.kind for e in tally.take()] == [EventKind.EVICTED]  # no longer a hit
    tally.report(rank_events((0, EventKind.EVICTED)))
    assert tally.take() == []  # already published as gone


def test_a_workers_disk_events_reach_the_scheduler(tmp_path: Path) -> None:
    config = TierConfig.from_dict({"host": {"capacity": 128}, "disk": {
        "path": str(tmp_path), "capacity": "1MiB", "fsync": False}})
    tiers = RankTiers(config, rank=1, slot_bytes=64)
    log = TierEventLog(tiers, rank=1)
    slab = HostSlab(2, 64, pin_memory=False)
    slab.write(0, b"kv" * 8)
    tiers.demote(slab, [(KEY, 0, 16)])
    tiers.drain()
    taken = log.take()
    assert taken is not None and log.take() is None
    assert [(r, e.kind, e.key, e.tier) for r, e in taken.get_all_events()] == [
        (1, EventKind.STORED, KEY, "disk")]
    tally = RankTally(num_workers=2)
    tally.report(taken)
    assert tally.take() == []  # rank 0 has not reported its shard
    tiers.close()


def test_vllm_receives_each_stored_chunk_as_an_event_and_quiet_steps_as_none() -> None:
    """vLLM 0.33's real scheduler asks ``take_events`` every step and reads whatever it is
    handed (``if connector_events: list(...)``): a step that stored chunks hands their
    ``BlockStored``; the others an empty sequence, not a generator vLLM has to run."""
    from vllm_helpers import make_sim

    from kvtier.integrations.vllm.testing import SimGroup

    sim = make_sim([SimGroup("full", 16)], chunk_tokens=32)
    connector = sim.scheduler.connector
    take, handed = connector.take_events, []

    def recorded() -> Any:
        events = take()
        handed.append(events)
        return events

    connector.take_events = recorded
    sim.add("a", list(range(100)), max_tokens=20)
    sim.run()
    sim.close()
    stored = [e for events in handed for e in events if isinstance(e, BlockStored)]
    assert len(stored) == 3  # chunks 0-2 (boundaries 32, 64, 96)
    assert all(isinstance(events, (list, tuple)) for events in handed)
    assert sum(not events for events in handed) >= len(handed) - 2


def test_a_lower_tiers_event_reaches_vllm_in_a_step_host_memory_stored_nothing() -> None:
    """The connector's ``take_events`` answers most steps without a call (nothing pending
    from host memory or the lower tiers); a step in which only a worker's disk stored a
    chunk still hands vLLM that chunk, as ``STORAGE``, once, and the next step nothing."""
    from vllm.v1.outputs import KVConnectorOutput
    from vllm_helpers import make_sim

    from kvtier.integrations.vllm.testing import SimGroup

    sim = make_sim([SimGroup("full", 16)], chunk_tokens=32)
    connector = sim.scheduler.connector
    assert connector.take_events() == ()
    connector.update_connector_output(KVConnectorOutput(
        kv_cache_events=rank_events((0, EventKind.STORED))))  # the sim's one worker
    handed = list(connector.take_events())
    assert [(type(e), e.medium) for e in handed] == [(BlockStored, "STORAGE")]
    assert connector.take_events() == ()
    sim.close()
