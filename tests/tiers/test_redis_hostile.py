"""Hostile neighbours and careless configs on the Redis tier: a value of the wrong Redis
type or a malformed record under one chunk's name costs that chunk only (a counted miss, the
name deleted), never the call; a write the server refuses costs its keys, not the reads;
malformed URLs and non-finite or out-of-range numbers are refused when the tier or its
config is built, never raised at first use."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from tier_helpers import GEOMETRY, Clock, RedisServer, items, key, payload

from kvtier.tiers.config import HostConfig, RedisConfig, TierConfig
from kvtier.tiers.records.format import encode
from kvtier.tiers.redis.options import MAX_TTL_S
from kvtier.tiers.redis.tier import Backoff, RedisTier

NAMES = [f"ok{i}" for i in range(18)]


def tier_for(server: RedisServer, **options: Any) -> RedisTier:
    return RedisTier(server.url, geometry=GEOMETRY, clock=Clock(), timeout_s=0.5,
                     backoff=Backoff(initial_s=1.0, max_s=8.0), **options)


def record(name: str, geometry: bytes = GEOMETRY, of: str | None = None) -> bytes:
    """The record of ``name``'s payload, claiming key ``of`` (default: ``name``)."""
    return b"".join(cast(list[bytes], encode(key(of or name), geometry, payload(name))))


WRONG_TYPES: dict[str, Callable[[Any, str], object]] = {
    "list": lambda admin, name: admin.rpush(name, b"x"),
    "hash": lambda admin, name: admin.hset(name, "f", b"x"),
    "set": lambda admin, name: admin.sadd(name, b"x"),
    "zset": lambda admin, name: admin.zadd(name, {b"x": 1.0}),
    "stream": lambda admin, name: admin.xadd(name, {"f": b"x"}),
}
MALFORMED: dict[str, bytes] = {
    "empty": b"",
    "shorter than a header": b"KVTR\x01",
    "garbage": payload("garbage", 1000),
    "truncated": record("bad")[:-1],
    "padded": record("bad") + b"\0",
    "another key's record": record("bad", of="other"),
    "another geometry": record("bad", geometry=b"othergeo"),
}


def assert_one_bad_key_costs_itself(server: RedisServer, plant: Callable[[Any, str], object]
                                    ) -> None:
    tier = tier_for(server)
    assert tier.put(items(NAMES)) == [key(n) for n in NAMES]
    admin: Any = server.client()
    bad = f"kvtier:{key('bad').hex()}"
    plant(admin, bad)
    got = tier.get([key(n) for n in NAMES[:9]] + [key("bad")] + [key(n) for n in NAMES[9:]])
    assert {k: bytes(v) for k, v in got.items()} == dict(items(NAMES))  # 18 of 18 served
    assert tier.stats.corrupt == 1 and tier.stats.errors == 0
    assert tier.healthy and tier.might_hold(key("ok0"))  # no backoff: the tier stays on
    assert admin.exists(bad) == 0  # unusable, in kvtier's namespace: removed
    assert tier.get([key("bad")]) == {} and tier.stats.corrupt == 1  # now a plain miss


@pytest.mark.redis
@pytest.mark.parametrize("kind", sorted(WRONG_TYPES))
def test_a_value_of_another_redis_type_is_a_miss_for_its_key_only(
    redis_server: RedisServer, kind: str
) -> None:
    assert_one_bad_key_costs_itself(redis_server, WRONG_TYPES[kind])


@pytest.mark.redis
@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_value_is_a_miss_for_its_key_only(
    redis_server: RedisServer, kind: str
) -> None:
    assert_one_bad_key_costs_itself(redis_server, lambda a, n: a.set(n, MALFORMED[kind]))


@pytest.mark.redis
def test_a_write_refused_for_memory_costs_its_keys_not_the_reads(
    redis_server: RedisServer,
) -> None:
    tier = tier_for(redis_server)
    tier.put(items("a"))
    admin: Any = redis_server.client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)  # every write: OOM
    assert tier.put(items("bc")) == [] and tier.stats.refused == 2
    assert tier.last_error is not None and "maxmemory" in tier.last_error
    assert list(tier.get([key("a")])) == [key("a")]  # same clock: no backoff was started
    assert tier.stats.skipped == 0


# ---- URLs: one check, before any connection ----------------------------------------------

BAD_URLS = {
    "redis://cache:notaport/0": "port must be an integer in 1..65535",
    "redis://cache:999999/0": "port must be an integer in 1..65535",
    "redis://cache:0/0": "port must be an integer in 1..65535",
    "redis://cache:-1/0": "port must be an integer in 1..65535",
    "redis://:::/x": "port must be an integer in 1..65535",
    "redis://[::1/0": "not a URL (Invalid IPv6 URL)",
    "redis://cache:6379/abc": "the database (the path) must be a number",
    "redis://cache:6379/-1": "the database (the path) must be a number",
    "redis://cache/1?db=2": "the database is given twice",
    "redis://cache?db=x": "URL option 'db' must be a number",
    "redis:///0": "give the server's host",
    "redis://:6379/0": "give the server's host",
    "http://cache:6379/0": "must look like redis://host:port/db",
    "REDIS://cache/0": "must look like redis://host:port/db",
    "redis:cache/0": "must look like redis://host:port/db",
    "": "must look like redis://host:port/db",
    "unix://tmp/redis.sock": "give the socket's path after three slashes",
    "unix://": "give the socket's path after three slashes",
    "redis://cache/0?socket_timeout=9": "unknown URL option 'socket_timeout'",
    "redis://cache/0?ssl_ca_certs=/ca.pem": "TLS options need rediss://",
    "rediss://cache/0?ssl_cert_reqs=maybe": "'ssl_cert_reqs' must be one of",
    "rediss://cache/0?ssl_check_hostname=perhaps": "'ssl_check_hostname' must be one of",
    "redis://cache/0?db=1&db=1": "'db' is given twice",
}


@pytest.mark.parametrize("url", sorted(BAD_URLS))
def test_a_malformed_url_is_refused_when_built(url: str) -> None:
    for build in (lambda: RedisTier(url), lambda: RedisConfig(url=url)):
        with pytest.raises(ValueError, match=f"url: .*{re.escape(BAD_URLS[url])}"):
            build()


@pytest.mark.parametrize("url", [42, b"redis://cache/0"])
def test_a_url_that_is_not_text_is_refused(url: object) -> None:
    with pytest.raises(ValueError, match="got a"):
        RedisConfig(url=url)  # type: ignore[arg-type]


def test_no_url_means_the_local_default() -> None:
    assert RedisConfig(url=None) == RedisConfig() == RedisConfig(url="redis://127.0.0.1:6379/0")


GOOD_URLS = [
    "redis://127.0.0.1:6379/0", "redis://cache", "redis://cache:6380", "redis://cache/",
    "redis://[::1]:6379/3", "redis://user:pw@cache/0", "redis://cache/0?password=pw",
    "redis://cache?db=2&client_name=kv", "unix:///run/redis.sock?db=1",
    "rediss://cache:6380/0?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/c.key"
    "&ssl_cert_reqs=required&ssl_check_hostname=false",
]


@pytest.mark.parametrize("url", GOOD_URLS)
def test_every_url_accepted_builds_a_redis_connection(url: str) -> None:
    """What the check accepts, redis-py builds a connection for (not opened): no option
    the connection class would refuse, no database silently 0."""
    redis = pytest.importorskip("redis")
    RedisConfig(url=url)
    client = redis.Redis.from_url(url)
    conn = client.connection_pool.make_connection()
    want_db = 3 if "/3" in url else 2 if "db=2" in url else 1 if "db=1" in url else 0
    assert conn.db == want_db


# ---- numbers: finite, and within what sockets and Redis take ----------------------------

BAD_NUMBERS: list[tuple[str, Callable[[float], object]]] = [
    ("[redis].timeout_s", lambda v: RedisConfig(timeout_s=v)),
    ("[redis].backoff_initial_s", lambda v: RedisConfig(backoff_initial_s=v)),
    ("[redis].backoff_max_s", lambda v: RedisConfig(backoff_max_s=v)),
    ("redis tier: timeout_s", lambda v: RedisTier(timeout_s=v)),
    ("backoff.initial_s", lambda v: Backoff(initial_s=v)),
    ("backoff.max_s", lambda v: Backoff(max_s=v)),
    ("backoff.factor", lambda v: Backoff(factor=v)),
    ("miss_ttl_s", lambda v: TierConfig(HostConfig("1MiB"), miss_ttl_s=v)),
]


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize(("field", "build"), BAD_NUMBERS, ids=[f for f, _ in BAD_NUMBERS])
def test_non_finite_numbers_are_refused(
    field: str, build: Callable[[float], object], value: float
) -> None:
    with pytest.raises(ValueError, match=rf"{re.escape(field)}: must be a finite number"):
        build(value)


@pytest.mark.parametrize("build", [lambda: RedisConfig(timeout_s=1e10),
                                   lambda: RedisTier(timeout_s=1e10)])
def test_a_timeout_sockets_cannot_take_is_refused(build: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match=r"timeout_s: must be a finite number in 0.001..3600"):
        build()


@pytest.mark.parametrize("build", [lambda v: RedisConfig(ttl_s=v), lambda v: RedisTier(ttl_s=v)])
@pytest.mark.parametrize("ttl", [MAX_TTL_S + 1, 2**63, 0, 1.5, math.inf, True])
def test_a_ttl_redis_would_refuse_is_refused_when_built(
    build: Callable[[object], object], ttl: object
) -> None:
    with pytest.raises(ValueError, match=r"ttl_s: must be an integer in 1..10{15}"):
        build(ttl)


@pytest.mark.redis
def test_the_longest_ttl_accepted_is_one_redis_takes(redis_server: RedisServer) -> None:
    tier = tier_for(redis_server, ttl_s=MAX_TTL_S)
    assert tier.put(items("t")) == [key("t")] and tier.stats.errors == 0
    assert list(tier.get([key("t")])) == [key("t")]


def test_backoff_stays_at_its_longest_however_many_failures() -> None:
    backoff = Backoff(initial_s=0.1, max_s=10.0, factor=2.0)
    assert [backoff.delay(n) for n in (1, 2, 1100, 10**6)] == [0.1, 0.2, 10.0, 10.0]


@pytest.mark.redis
def test_a_unix_socket_url_reaches_the_server(tmp_path: Path) -> None:
    from tier_helpers import REDIS_SERVER

    if REDIS_SERVER is None:
        pytest.skip("redis-server is not on PATH (CI installs Debian's redis-server package)")
    sock = tmp_path / "redis.sock"
    server = RedisServer(tmp_path, args=["--unixsocket", str(sock)])
    server.start()
    try:
        tier = RedisTier(f"unix://{sock}?db=1", geometry=GEOMETRY, clock=Clock())
        assert tier.put(items("u")) == [key("u")] and list(tier.get([key("u")])) == [key("u")]
        tier.close()
    finally:
        server.stop()
