"""The scheduler's side of promotions (``integrations.vllm.tiers.TieredHost``, no vLLM
needed): the chunks a step's lookups find on the Redis server are promoted in one job, one
read of the server, however the probes that found them were split and whenever each
finished; the chunks they find on disk likewise, in one job of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
from tier_helpers import GEOMETRY, SLOT, RedisServer, items, key

from kvtier.integrations.vllm.tiers import TieredHost, scheduler_tiers
from kvtier.store.manager import ChunkStore
from kvtier.store.results import ChunkState, StoreRefusal
from kvtier.tiers.config import TierConfig
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.redis.tier import RedisTier


def _on_disk(tmp_path: Path, names: list[str], host: ChunkStore) -> TieredHost:
    """The scheduler's tiers over ``host`` (one rank), with ``names`` on its disk."""
    below = DiskTier(tmp_path / "kv" / "rank0", 64 * SLOT, SLOT, geometry=GEOMETRY, fsync=False)
    assert below.put(items(names)) == [key(n) for n in names]
    below.close()
    return _tiers({"disk": {"path": str(tmp_path / "kv"), "capacity": "1MiB"}}, host)


def _on_redis(url: str, names: list[str], host: ChunkStore) -> TieredHost:
    """The scheduler's tiers over ``host`` (one rank), with ``names`` on the server."""
    below = RedisTier(url, namespace="kvtier:rank0", geometry=GEOMETRY)
    assert below.put(items(names)) == [key(n) for n in names]
    below.close()
    return _tiers({"redis": {"url": url}}, host)


def _tiers(section: dict[str, object], host: ChunkStore) -> TieredHost:
    config = TierConfig.from_dict({"host": {"capacity": host.num_slots * SLOT}, **section})
    wrap = scheduler_tiers(config, 1, SLOT, GEOMETRY)
    assert wrap is not None
    return wrap(host)


def test_a_steps_disk_finds_make_one_promotion(tmp_path: Path) -> None:
    names = ["c0", "c1", "c2", "c3"]
    host = ChunkStore(4)
    tiers = _on_disk(tmp_path, names[:3], host)
    try:
        # c3 is in host memory (the least recently used chunk there), the rest on disk; a
        # request's lookup asks for the prompt's last chunk first, then for the rest: one
        # promotion of both finds, and the room for it is made without evicting c3
        tiers.request = "r1"
        for name in ("c3", "x"):
            held = host.prepare_store([key(name)])
            assert not isinstance(held, StoreRefusal)
            host.complete_store(held, True)
        assert tiers.lookup([key("c2"), key("c3")]) == [ChunkState.WRITING, ChunkState.READY]
        assert tiers.lookup([key("c0"), key("c1")]) == [ChunkState.WRITING] * 2
        tiers.request = None
        promotions, _ = tiers.take_plan([])
        assert [(p.tier, set(p.keys)) for p in promotions] == [
            ("disk", {key("c2"), key("c0"), key("c1")})]
        assert host.lookup([key("c3"), key("x")]) == [ChunkState.READY, ChunkState.ABSENT]
        assert tiers.lookup([key(n) for n in names]) == [ChunkState.WRITING] * 3 + [
            ChunkState.READY]
        assert tiers.take_plan([]) == ((), ())  # promoted once
    finally:
        tiers.close()


def test_each_requests_disk_finds_are_a_promotion_of_their_own(tmp_path: Path) -> None:
    """Two requests' finds in one step: 3 + 2 chunks, 4 host slots. Each fits alone; one
    job of both never would (nothing promoted, step after step), and a bad record of one
    would fail the other's."""
    a, b = ["a0", "a1", "a2"], ["b0", "b1"]
    tiers = _on_disk(tmp_path, a + b, ChunkStore(4))
    try:
        for request, names in (("ra", a), ("rb", b), (None, ["b0"])):
            tiers.request = request
            tiers.lookup([key(n) for n in names])
        tiers.request = None
        promotions, _ = tiers.take_plan([])
        assert [(p.tier, set(p.keys)) for p in promotions] == [
            ("disk", {key(n) for n in a})]  # b's did not fit beside a's: they wait
        assert tiers.lookup([key(n) for n in b]) == [ChunkState.WRITING] * 2
    finally:
        tiers.close()


@pytest.mark.redis
def test_a_steps_probes_make_one_promotion(redis_server: RedisServer, tmp_path: Path) -> None:
    names = ["c0", "c1", "c2"]
    tiers = _on_redis(redis_server.url, names, ChunkStore(8))
    try:
        # a request's lookup asks for the prompt's last chunk first; its probe finishes
        # before the lookup asks for the rest (the second lookup folds it in)
        tiers.request = "r1"
        assert tiers.lookup([key("c2")]) == [ChunkState.WRITING]
        tiers.settle()
        assert tiers.lookup([key("c0"), key("c1")]) == [ChunkState.WRITING] * 2
        tiers.settle()
        tiers.request = None
        promotions, _ = tiers.take_plan([])
        assert [(p.tier, set(p.keys)) for p in promotions] == [
            ("redis", {key("c2"), key("c0"), key("c1")})]
        assert tiers.lookup([key(n) for n in names]) == [ChunkState.WRITING] * 3
        # a chunk the server lacks is absent once its probe is folded in, not promoted
        assert tiers.lookup([key("gone")]) == [ChunkState.WRITING]
        tiers.settle()
        assert tiers.lookup([key("gone")]) == [ChunkState.ABSENT]
        assert tiers.take_plan([]) == ((), ())
    finally:
        tiers.close()


@pytest.mark.redis
def test_each_requests_probes_are_a_promotion_of_their_own(redis_server: RedisServer) -> None:
    tiers = _on_redis(redis_server.url, ["a0", "a1", "b0"], ChunkStore(8))
    try:
        for request, names in (("ra", ["a1"]), ("rb", ["b0"]), ("ra", ["a0"]), (None, ["zz"])):
            tiers.request = request
            tiers.lookup([key(n) for n in names])
        tiers.request = None
        tiers.settle()
        promotions, _ = tiers.take_plan([])
        assert sorted(sorted(p.keys) for p in promotions) == sorted(
            [sorted([key("a0"), key("a1")]), [key("b0")]])
        assert {p.tier for p in promotions} == {"redis"}
    finally:
        tiers.close()
