"""Redis-tier faults: a corrupted value, a server stopped and started again mid-run, a
paused (slow) server, an unreachable one, a server refusing writes, and two OS processes
sharing one server; and what a write leaves on the server (exactly one record per key)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from tier_helpers import GEOMETRY, Clock, RedisServer, items, key, payload, poll

from kvtier.tiers.records.format import encode
from kvtier.tiers.redis.each import Each, Faults, Reply, run_each
from kvtier.tiers.redis.tier import Backoff, RedisTier

pytestmark = pytest.mark.redis
CHILD = Path(__file__).with_name("tier_child.py")


def tier_for(server: RedisServer, clock: Clock | None = None, **options: object) -> RedisTier:
    return RedisTier(server.url, geometry=GEOMETRY, clock=clock or Clock(),
                     timeout_s=0.2, backoff=Backoff(initial_s=1.0, max_s=8.0),
                     **options)  # type: ignore[arg-type]


def test_a_corrupted_value_is_a_counted_miss_and_deleted(redis_server: RedisServer) -> None:
    tier = tier_for(redis_server)
    tier.put(items("ab"))
    admin = redis_server.client()
    admin.setrange(f"kvtier:{key('a').hex()}", 500, b"\xff")  # type: ignore[attr-defined]
    assert list(tier.get([key("a"), key("b")])) == [key("b")]
    assert tier.stats.corrupt == 1
    assert admin.exists(f"kvtier:{key('a').hex()}") == 0  # type: ignore[attr-defined]


def test_a_value_is_exactly_the_record_and_expires(redis_server: RedisServer) -> None:
    tier = tier_for(redis_server, ttl_s=60)
    big = [(key("big"), payload("big", 3 << 20))]  # sent from its own buffer, not joined
    tier.put(items("ab") + big)
    admin = redis_server.client()
    for k, data in [*items("ab"), *big]:
        name = f"kvtier:{k.hex()}"
        assert admin.get(name) == b"".join(encode(k, GEOMETRY, data))  # type: ignore[attr-defined]
        assert 0 < admin.ttl(name) <= 60  # type: ignore[attr-defined]
    assert bytes(tier.get([key("big")])[key("big")]) == payload("big", 3 << 20)


def test_a_refused_batch_is_a_counted_refusal_then_writes_resume(
    redis_server: RedisServer,
) -> None:
    clock = Clock()
    tier = tier_for(redis_server, clock)
    admin = redis_server.client()
    admin.config_set("maxmemory-policy", "noeviction")  # type: ignore[attr-defined]
    admin.config_set("maxmemory", 1)  # type: ignore[attr-defined]  # every write: OOM
    assert tier.put(items("ab")) == [] and tier.stats.errors == 1
    admin.config_set("maxmemory", 0)  # type: ignore[attr-defined]
    clock.now += 1.0
    assert tier.put(items("cd")) == [key("c"), key("d")]  # the connection is not desynced
    got = tier.get([key(n) for n in "abcd"])
    assert {k: bytes(v) for k, v in got.items()} == dict(items("cd")) and tier.healthy


def test_namespaces_do_not_share(redis_server: RedisServer) -> None:
    tier_for(redis_server, namespace="team-a").put(items("a"))
    assert tier_for(redis_server, namespace="team-b").get([key("a")]) == {}


def test_stopped_then_restarted_server_misses_then_hits_again(
    redis_server: RedisServer,
) -> None:
    clock = Clock()
    tier = tier_for(redis_server, clock)
    tier.put(items("a"))
    redis_server.stop()
    assert tier.get([key("a")]) == {} and tier.stats.errors == 1  # a miss, not a crash
    assert not tier.might_hold(key("a"))  # backing off: no network at all
    assert tier.put(items("b")) == [] and tier.stats.skipped == 1
    redis_server.start()  # same port, empty (no persistence)
    clock.now += 1.0  # the backoff has passed: the next call reconnects
    assert tier.put(items("b")) == [key("b")]
    assert bytes(tier.get([key("b")])[key("b")]) == payload("b") and tier.healthy


def test_backoff_doubles_while_the_server_stays_down(redis_server: RedisServer) -> None:
    clock = Clock()
    tier = tier_for(redis_server, clock)
    redis_server.stop()
    waits = []
    for _ in range(5):
        tier.get([key("a")])
        start = clock.now
        while not tier.might_hold(key("a")):
            clock.now += 0.5
        waits.append(clock.now - start)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0] and tier.stats.errors == 5


def test_a_paused_server_costs_one_timeout_not_a_stall(redis_server: RedisServer) -> None:
    tier = tier_for(redis_server)
    tier.put(items("a"))
    admin = redis_server.client()
    admin.client_pause(1000)  # type: ignore[attr-defined]  # every client waits 1 s
    start = time.monotonic()
    assert tier.get([key("a")]) == {}
    assert time.monotonic() - start < 0.9 and tier.stats.errors == 1


def test_an_unreachable_server_is_a_miss(tmp_path: Path) -> None:
    from tier_helpers import free_port

    tier = RedisTier(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2, clock=Clock())
    assert tier.get([key("a")]) == {} and tier.put(items("a")) == []
    assert tier.stats.errors == 1 and tier.stats.skipped == 1


def child(*args: str) -> str:
    out = subprocess.run([sys.executable, str(CHILD), *args], capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.strip()


def test_two_processes_share_one_server(redis_server: RedisServer) -> None:
    assert child("redis-put", redis_server.url, "p1", "p2") == "done"
    assert json.loads(child("redis-get", redis_server.url, "p1", "p2", "p3")) == ["p1", "p2"]
    tier_for(redis_server).put(items(["p3"]))  # this process stores, another reads it
    assert json.loads(child("redis-get", redis_server.url, "p3")) == ["p3"]


def test_a_restart_seen_by_a_bounded_poll(redis_server: RedisServer) -> None:
    tier = RedisTier(redis_server.url, geometry=GEOMETRY, timeout_s=0.2,
                     backoff=Backoff(initial_s=0.0, max_s=0.0))
    redis_server.stop()
    redis_server.start()
    assert poll(lambda: tier.put(items("r")) == [key("r")], timeout_s=10.0)
    assert list(tier.get([key("r")])) == [key("r")]


class _DropsAClient(Each):
    """``GET`` on each node; packing the second node's commands drops the first node's
    client, as a cluster's slot-map refresh replacing its clients mid-call does."""

    def pack(self, conn: Any, indexes: Sequence[int], asking: bool) -> list[bytes]:
        if indexes == [1]:
            self.clients.pop("first", None)  # type: ignore[attr-defined]
            gc.collect()
        return super().pack(conn, indexes, asking)


def test_a_client_replaced_mid_call_keeps_its_replies(redis_server: RedisServer) -> None:
    """A redis-py client collected while its request is in flight closes its pool; a call
    holds every node's client until its replies are in (a cluster lost a live master's
    replies this way when a dead master's failure refreshed the slot map)."""
    redis_server.client().mset({"a": b"1", "b": b"2"})  # type: ignore[attr-defined]
    clients = {node: redis.Redis(port=redis_server.port) for node in ("first", "second")}
    each = _DropsAClient("GET", ["a", "b"])
    object.__setattr__(each, "clients", clients)
    replies: list[Reply] = [None, None]
    failed: list[BaseException] = []
    def run(jobs: Sequence[Callable[[], None]]) -> None:
        for job in jobs:
            job()

    run_each(each, {("first", False): [0], ("second", False): [1]}, clients.__getitem__,
             run, Faults((redis.RedisError, OSError),
             redis.ResponseError), 2.0, lambda node: None,
             lambda node, error: failed.append(error), replies)
    assert "first" not in clients  # the client was dropped mid-call
    assert failed == [] and replies == [b"1", b"2"]
