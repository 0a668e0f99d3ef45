"""The Redis tier on a real Redis Cluster: batches split over every master, a killed
master costs misses for its slots only, a paused one costs one socket timeout at most,
a restarted one serves again after its backoff, MOVED and ASK are followed, and a bad
value under one key stays that key's miss."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from tier_helpers import GEOMETRY, Clock, items, key, payload, poll

from kvtier.keys import ChunkKey
from kvtier.tiers.redis.tier import Backoff, RedisTier
from redis_cluster import LocalRedisCluster

pytestmark = pytest.mark.redis
TierOn = Callable[..., RedisTier]
"""Builds a tier on a cluster, in a namespace of its own, with the test's clock."""
NAMES = [f"c{i}" for i in range(48)]  # 48 keys: every master of three holds some


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tier_on(clock: Clock) -> Iterator[TierOn]:
    made: list[RedisTier] = []

    def build(cluster: LocalRedisCluster, timeout_s: float = 0.5) -> RedisTier:
        tier = RedisTier(cluster_nodes=cluster.startup_nodes, geometry=GEOMETRY, clock=clock,
                         namespace=f"k{uuid.uuid4().hex[:8]}", timeout_s=timeout_s,
                         backoff=Backoff(initial_s=1.0, max_s=8.0))
        made.append(tier)
        return tier

    yield build
    for tier in made:
        tier.close()


def name_of(tier: RedisTier, n: str) -> str:
    """The Redis key a chunk named ``n`` is stored under (namespace:key hex)."""
    return f"{tier.namespace}:{key(n).hex()}"


def owners(tier: RedisTier, cluster: LocalRedisCluster) -> dict[str, int]:
    """Chunk name -> index of the master holding it, as the cluster itself says."""
    return {n: cluster.master_of(name_of(tier, n)) for n in NAMES}


def fill(tier: RedisTier, cluster: LocalRedisCluster) -> tuple[int, list[str], list[str]]:
    """Store every chunk of ``NAMES``; the master holding ``c0``, the names it holds, and
    the other masters' names."""
    tier.put(items(NAMES))
    owner = owners(tier, cluster)
    victim = owner["c0"]
    return (victim, sorted(n for n in NAMES if owner[n] == victim),
            sorted(n for n in NAMES if owner[n] != victim))


def got(tier: RedisTier, names: Sequence[str]) -> dict[str, bytes]:
    by_key: dict[ChunkKey, str] = {key(n): n for n in names}
    return {by_key[k]: bytes(v) for k, v in tier.get(list(by_key)).items()}


def test_one_batch_spans_every_master(
    shared_cluster: LocalRedisCluster, tier_on: TierOn
) -> None:
    tier = tier_on(shared_cluster)
    assert tier.put(items(NAMES)) == [key(n) for n in NAMES]
    assert set(owners(tier, shared_cluster).values()) == set(shared_cluster.masters())
    assert got(tier, [*NAMES, "absent"]) == {n: payload(n) for n in NAMES}
    snap = tier.stats.snapshot()
    assert (snap["reads"], snap["writes"], snap["hits"], snap["misses"]) == (1, 1, 48, 1)
    assert tier.exists([key("c0"), key("absent")]) == [True, False]
    tier.remove([key(n) for n in NAMES[:24]])
    assert sorted(got(tier, NAMES)) == sorted(NAMES[24:])
    assert tier.healthy and tier.last_error is None
    tier.check_invariants()


def test_a_bad_value_under_one_key_is_that_keys_miss(
    shared_cluster: LocalRedisCluster, tier_on: TierOn
) -> None:
    tier = tier_on(shared_cluster)
    tier.put(items(NAMES))
    for n, value in (("c1", None), ("c2", b"not a record")):
        node = shared_cluster.nodes[shared_cluster.master_of(name_of(tier, n))]
        node.query("DEL", name_of(tier, n))
        if value is None:  # a list where a string should be: WRONGTYPE on GET
            node.query("LPUSH", name_of(tier, n), "x")
        else:
            node.query("SET", name_of(tier, n), value)
    assert sorted(got(tier, NAMES)) == sorted(set(NAMES) - {"c1", "c2"})
    assert tier.stats.corrupt == 2 and tier.stats.errors == 0 and tier.healthy
    assert got(tier, ["c1", "c2"]) == {} and tier.stats.corrupt == 2  # dropped: plain misses


def test_a_killed_master_costs_misses_for_its_slots_only(
    redis_cluster: LocalRedisCluster, tier_on: TierOn, clock: Clock
) -> None:
    tier = tier_on(redis_cluster)
    victim, _, alive = fill(tier, redis_cluster)
    redis_cluster.kill(victim)

    assert sorted(got(tier, NAMES)) == alive
    assert tier.stats.errors == 1 and not tier.healthy
    assert tier.last_error is not None and str(redis_cluster.ports[victim]) in tier.last_error
    assert not tier.might_hold(key("c0")) and all(tier.might_hold(key(n)) for n in alive)

    assert sorted(got(tier, NAMES)) == alive  # the dead node is left alone: no new error
    assert (tier.stats.errors, tier.stats.skipped) == (1, 1)
    rewritten = tier.put(items(NAMES))  # writes to the other masters go through
    assert sorted(rewritten) == sorted(key(n) for n in alive)
    tier.check_invariants()


@pytest.mark.parametrize("down", [0, 2])
def test_a_tier_opened_while_a_master_is_down_serves_the_others(
    redis_cluster: LocalRedisCluster, tier_on: TierOn, down: int
) -> None:
    """A new process meeting a cluster with one master dead (0: the first start-up node,
    which also owns the map's first slots) still serves every other master's chunks."""
    writer = tier_on(redis_cluster)
    writer.put(items(NAMES))
    owner = owners(writer, redis_cluster)
    alive = sorted(n for n in NAMES if owner[n] != down)
    assert 0 < len(alive) < len(NAMES)
    redis_cluster.kill(down)

    reader = RedisTier(cluster_nodes=redis_cluster.startup_nodes, geometry=GEOMETRY,
                       namespace=writer.namespace, timeout_s=0.5)
    try:
        assert reader.exists([key(n) for n in NAMES]) == [owner[n] != down for n in NAMES]
        assert sorted(got(reader, NAMES)) == alive
    finally:
        reader.close()


def test_a_restarted_master_serves_again_after_its_backoff(
    redis_cluster: LocalRedisCluster, tier_on: TierOn, clock: Clock
) -> None:
    tier = tier_on(redis_cluster)
    victim, lost, _ = fill(tier, redis_cluster)
    redis_cluster.kill(victim)
    assert "c0" not in got(tier, NAMES)
    redis_cluster.restart(victim)  # back, empty (no persistence)

    clock.now += 0.5  # within the 1 s backoff: still left alone
    assert not tier.might_hold(key("c0")) and tier.put(items(lost)) == []
    clock.now += 0.6
    assert tier.might_hold(key("c0"))
    assert tier.put(items(lost)) == [key(n) for n in lost]
    assert got(tier, NAMES) == {n: payload(n) for n in NAMES}
    # the kill costs one error; a call that meets the master while it restarts may cost
    # another (a loaded machine), never a lost chunk
    assert tier.healthy and tier.stats.errors >= 1


def test_a_paused_master_costs_one_socket_timeout_at_most(
    redis_cluster: LocalRedisCluster, tier_on: TierOn, clock: Clock
) -> None:
    timeout_s = 0.3
    tier = tier_on(redis_cluster, timeout_s=timeout_s)
    victim, _, alive = fill(tier, redis_cluster)
    redis_cluster.pause(victim)  # SIGSTOP: connections open, nothing answered

    start = time.monotonic()
    assert sorted(got(tier, NAMES)) == alive
    stalled = time.monotonic() - start
    # without socket timeouts the call never returns; the bound leaves room for a busy
    # machine (the call waits one timeout, in parallel with the other masters)
    assert timeout_s * 0.9 <= stalled < timeout_s + 3.0
    assert tier.stats.errors == 1 and "does not answer" in (tier.last_error or "")

    start = time.monotonic()  # backing off: the paused node is not even asked
    assert sorted(tier.put(items(NAMES))) == sorted(key(n) for n in alive)
    assert time.monotonic() - start < timeout_s * 0.9 and tier.stats.skipped == 1

    redis_cluster.resume(victim)
    clock.now += 1.1
    assert got(tier, NAMES) == {n: payload(n) for n in NAMES}  # nothing was lost
    assert tier.healthy


def test_two_paused_masters_cost_one_socket_timeout_together(
    redis_cluster: LocalRedisCluster, tier_on: TierOn, clock: Clock
) -> None:
    """Reads ask every master from one thread: still, the masters that stall share one
    timeout, when their connections are open and when they must be made anew."""
    timeout_s = 1.5
    tier = tier_on(redis_cluster, timeout_s=timeout_s)
    tier.put(items(NAMES))
    owner = owners(tier, redis_cluster)
    alive, *paused = redis_cluster.masters()
    for m in paused:
        redis_cluster.pause(m)
    served = sorted(n for n in NAMES if owner[n] == alive)

    for round_ in ("open connections", "new connections after the backoff"):
        start = time.monotonic()
        found = got(tier, NAMES)
        stalled = time.monotonic() - start
        # one after the other they would take two timeouts at least
        assert timeout_s * 0.9 <= stalled < 2 * timeout_s, (round_, stalled)
        assert all(found[n] == payload(n) for n in found) and set(found) <= set(served)
        if round_ == "open connections":
            assert sorted(found) == served
        # (later the live master, cut off from the majority for cluster-node-timeout, says
        # CLUSTERDOWN itself: Redis Cluster's rule, a miss for its names too)
        last = (tier.last_error or "").lower()
        assert tier.stats.errors >= 2 and ("does not answer" in last or "cluster is down" in last)
        clock.now += 1.1  # the backoff (1 s) ends: the next call reconnects

    for m in paused:
        redis_cluster.resume(m)

    def healed() -> bool:  # once the cluster has healed, nothing was lost
        clock.now += 10.0  # past any backoff
        return got(tier, NAMES) == {n: payload(n) for n in NAMES}

    assert poll(healed, timeout_s=30.0)


def test_a_moved_slot_is_followed(redis_cluster: LocalRedisCluster, tier_on: TierOn) -> None:
    tier = tier_on(redis_cluster)
    tier.put(items(NAMES))  # the tier learns the slot map now
    owner = owners(tier, redis_cluster)
    target = next(m for m in redis_cluster.masters() if m != owner["c0"])
    redis_cluster.move_slot(redis_cluster.slot_of(name_of(tier, "c0")), target)
    assert redis_cluster.master_of(name_of(tier, "c0")) == target

    assert got(tier, ["c0"]) == {"c0": payload("c0")}  # the old owner answers MOVED
    tier.remove([key("c0")])
    assert tier.put(items(["c0"])) == [key("c0")] and got(tier, ["c0"]) == {"c0": payload("c0")}
    assert redis_cluster.nodes[target].query("EXISTS", name_of(tier, "c0")) == 1
    assert tier.healthy and tier.last_error is None and tier.stats.errors == 0


def test_an_ask_redirection_is_followed(
    redis_cluster: LocalRedisCluster, tier_on: TierOn
) -> None:
    tier = tier_on(redis_cluster)
    tier.put(items(["c0"]))
    slot = redis_cluster.slot_of(name_of(tier, "c0"))
    sibling = next(f"s{i}" for i in range(10**6)
                   if redis_cluster.slot_of(name_of(tier, f"s{i}")) == slot)
    source = redis_cluster.master_of(name_of(tier, "c0"))
    target = next(m for m in redis_cluster.masters() if m != source)
    redis_cluster.move_slot(slot, target, finish=False)  # keys moved, slot still migrating

    assert got(tier, ["c0"]) == {"c0": payload("c0")}  # the source answers ASK
    assert tier.put(items([sibling])) == [key(sibling)]  # a new key goes to the target
    assert tier.exists([key(sibling)]) == [True]
    redis_cluster.finish_move(slot, target)
    assert redis_cluster.nodes[target].query("EXISTS", name_of(tier, sibling)) == 1
    assert got(tier, ["c0", sibling]) == {"c0": payload("c0"), sibling: payload(sibling)}
    assert tier.healthy and tier.stats.errors == 0


def test_a_replica_promoted_in_place_of_a_killed_master_is_found(
    tmp_path: Path, tier_on: TierOn, clock: Clock
) -> None:
    with LocalRedisCluster(tmp_path / "replicated", replicas=1) as cluster:
        tier = tier_on(cluster)
        victim, lost, alive = fill(tier, cluster)
        cluster.wait_replicated()
        cluster.kill(victim)
        assert set(alive) <= set(got(tier, NAMES))
        cluster.wait_failover(victim)

        def served_again() -> bool:
            clock.now += 20.0  # past any backoff: each poll asks the node again
            return got(tier, lost) == {n: payload(n) for n in lost}

        assert poll(served_again, timeout_s=30.0)  # the slot map was re-read
        assert got(tier, NAMES) == {n: payload(n) for n in NAMES}
