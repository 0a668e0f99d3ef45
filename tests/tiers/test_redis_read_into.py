"""A promotion from Redis reads each value off the socket straight into its host slot
(``RedisTier.get_into``): the same records found, the same verified bytes, the same verdicts
and the same names left on the server as ``get``, for every damaged or foreign value, on one
server and on a cluster, for values that fit the first read and values of a megabyte."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import pytest
from tier_helpers import GEOMETRY, RedisServer, key, payload

from kvtier.keys import ChunkKey
from kvtier.tiers.records.format import HEADER_BYTES, encode
from kvtier.tiers.records.seal import MacSeal, Secret
from kvtier.tiers.redis.tier import RedisTier
from redis_cluster import LocalRedisCluster

pytestmark = pytest.mark.redis

NAMES = ["a", "b", "c", "d", "e", "f"]
VICTIM = "c"
SIZES = {"4 KiB": 4096, "1 MiB + 3": (1 << 20) + 3}
PAST = 16
"""Bytes after each slot's payload that must be left as they were."""


def _record(name: str, size: int, of: str | None = None) -> bytes:
    return b"".join(cast(list[bytes], encode(key(of or name), GEOMETRY, payload(name, size))))


def _flip(at: int) -> Callable[[bytes, int], bytes]:
    def flip(value: bytes, size: int) -> bytes:
        data = bytearray(value)
        data[at] ^= 0x01
        return bytes(data)
    return flip


DAMAGE: dict[str, Callable[[bytes, int], bytes | None]] = {
    "intact": lambda v, n: v,
    "truncated": lambda v, n: v[:-1],
    "padded": lambda v, n: v + b"\0",
    "payload bit": _flip(HEADER_BYTES + 7),
    "last payload bit": _flip(-1),
    "header byte": _flip(0),
    "header only": lambda v, n: v[:HEADER_BYTES],
    "shorter than a header": lambda v, n: v[: HEADER_BYTES // 2],
    "empty": lambda v, n: b"",
    "another key's record": lambda v, n: _record("a", n),
    "longer than its slot": lambda v, n: v + v,
    "a list, not a string": lambda v, n: None,
    "deleted": lambda v, n: b"deleted",
}


def _tier(where: RedisServer | LocalRedisCluster, namespace: str,
          seal: MacSeal | None = None) -> RedisTier:
    if isinstance(where, RedisServer):
        return RedisTier(where.url, namespace=namespace, geometry=GEOMETRY, seal=seal)
    return RedisTier(cluster_nodes=where.startup_nodes, namespace=namespace,
                     geometry=GEOMETRY, seal=seal)


def _admin(where: RedisServer | LocalRedisCluster) -> Any:
    import redis

    if isinstance(where, RedisServer):
        return where.client()
    host, port = where.startup_nodes[0].rsplit(":", 1)
    return redis.RedisCluster(host=host, port=int(port))


Outcome = tuple[dict[ChunkKey, bytes], tuple[int, ...], bool, np.ndarray]


def _outcome(where: RedisServer | LocalRedisCluster, damage: str, size: int, into: bool,
             seal: MacSeal | None = None) -> Outcome:
    """Records written, one damaged, then read by ``get`` or ``get_into``: the payloads,
    the tier's verdict counters, whether the victim's name is left, and the slots."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    tier = _tier(where, namespace, seal)
    admin = _admin(where)
    try:
        assert len(tier.put([(key(n), payload(n, size)) for n in NAMES])) == len(NAMES)
        name = f"{namespace}:{key(VICTIM).hex()}"
        value = DAMAGE[damage](bytes(admin.get(name)), size)
        admin.delete(name)
        if value is None:
            admin.rpush(name, b"x")
        elif value != b"deleted":
            admin.set(name, value)
        slots = np.full((len(NAMES), size + PAST), 0xEE, dtype=np.uint8)
        keys = [key(n) for n in NAMES]
        got = (tier.get_into(keys, [memoryview(row.data) for row in slots]) if into
               else tier.get(keys))
        s = tier.stats
        verdicts = (s.hits, s.misses, s.corrupt, s.errors, s.bytes_read)
        return {k: bytes(v) for k, v in got.items()}, verdicts, bool(admin.exists(name)), slots
    finally:
        tier.close()
        admin.close()


@pytest.fixture(params=["server", "cluster"])
def where(request: pytest.FixtureRequest) -> RedisServer | LocalRedisCluster:
    return cast(RedisServer | LocalRedisCluster, request.getfixturevalue(
        "redis_server" if request.param == "server" else "shared_cluster"))


@pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_get_into_finds_what_get_finds_and_refuses_what_it_refuses(
    where: RedisServer | LocalRedisCluster, damage: str, size: int
) -> None:
    got, verdicts, left = _outcome(where, damage, size, into=False)[:3]
    got_into, verdicts_into, left_into, slots = _outcome(where, damage, size, into=True)
    assert got_into == got and verdicts_into == verdicts and left_into == left
    for i, name in enumerate(NAMES):
        if key(name) in got_into:  # verified bytes, in the slot, nothing past the payload
            assert got_into[key(name)] == payload(name, size)
            assert bytes(slots[i, :size]) == payload(name, size)
            assert bytes(slots[i, size:]) == b"\xee" * PAST
    # the negative control: only the intact value is served; each damage costs its record
    assert (key(VICTIM) in got_into) == (damage == "intact")
    assert len(got_into) == len(NAMES) - (damage != "intact")


def test_the_payloads_returned_are_the_slots_memory(redis_server: RedisServer) -> None:
    tier = _tier(redis_server, "kvtier")
    size = SIZES["1 MiB + 3"]
    tier.put([(key("a"), payload("a", size))])
    slot = np.zeros(size, dtype=np.uint8)
    got = tier.get_into([key("a")], [memoryview(slot.data)])
    slot[-1] ^= 0xFF  # a write to the slot shows through the payload: no copy was made
    assert got[key("a")][-1] == slot[-1]
    tier.close()


def test_a_sealed_tier_reads_as_get_and_copies_into_the_slots(redis_server: RedisServer
                                                              ) -> None:
    seal = MacSeal(Secret(b"k" * 32, "test"))
    got, verdicts, _, _ = _outcome(redis_server, "payload bit", 4096, into=False, seal=seal)
    got_into, verdicts_into, _, slots = _outcome(redis_server, "payload bit", 4096, into=True,
                                                 seal=seal)
    assert got_into == got and verdicts_into == verdicts and key(VICTIM) not in got_into
    assert bytes(slots[0, :4096]) == payload("a", 4096)


def test_views_that_do_not_match_the_keys_are_refused(redis_server: RedisServer) -> None:
    tier = _tier(redis_server, "kvtier")
    with pytest.raises(ValueError, match="one view per key"):
        tier.get_into([key("a"), key("b")], [memoryview(bytearray(16))])
    tier.close()


def test_a_missing_key_and_a_server_down_are_misses(redis_server: RedisServer) -> None:
    tier = _tier(redis_server, "kvtier")
    tier.put([(key("a"), payload("a", 4096))])
    views = [memoryview(bytearray(4096)) for _ in range(2)]
    got = tier.get_into([key("a"), key("nope")], views)
    assert list(got) == [key("a")] and tier.stats.misses == 1
    redis_server.stop()
    assert tier.get_into([key("a")], views[:1]) == {}
    assert tier.stats.errors == 1 and not tier.healthy
    tier.close()


# ---- pacing: a megabyte asked for ahead, not the whole promotion at once -------------------


@contextmanager
def _relay(server: RedisServer) -> Iterator[tuple[str, list[int]]]:
    """A TCP relay in front of ``server``: its URL, and, for each piece of reply bytes
    relayed back, how many ``GET``s had been relayed to the server before it."""
    listener = socket.create_server(("127.0.0.1", 0))
    sent = bytearray()  # every request byte relayed (a command may come in two pieces)
    marks: list[int] = []

    def pump(src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if requests:
                    sent.extend(data)
                else:
                    marks.append(sent.count(b"\r\nGET\r\n"))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", server.port))
            for args in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=pump, args=args, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0", marks
    finally:
        listener.close()


@pytest.mark.parametrize(("size", "asked_first"), [(SIZES["1 MiB + 3"], 1), (4096, 6)],
                         ids=["1 MiB + 3", "4 KiB"])
def test_a_promotion_asks_for_about_a_megabyte_ahead_of_what_it_reads(
    redis_server: RedisServer, size: int, asked_first: int
) -> None:
    """Values of a megabyte are asked for one ahead of the reply being read (the server
    copies the next while the last is on the wire), small ones all at once; the same
    payloads arrive either way."""
    writer = _tier(redis_server, "paced")
    assert len(writer.put([(key(n), payload(n, size)) for n in NAMES])) == len(NAMES)
    writer.close()
    with _relay(redis_server) as (url, marks):
        tier = RedisTier(url, namespace="paced", geometry=GEOMETRY)
        assert tier.exists([key("a")]) == [True]  # connected: the handshake's replies
        marks.clear()
        slots = np.zeros((len(NAMES), size), dtype=np.uint8)
        got = tier.get_into([key(n) for n in NAMES], [memoryview(r.data) for r in slots])
        tier.close()
    assert {k: bytes(v) for k, v in got.items()} == {key(n): payload(n, size) for n in NAMES}
    assert marks[0] == asked_first  # GETs the server had when its first reply came back
