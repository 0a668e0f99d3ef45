"""Fixtures of the tier tests: a private ``redis-server`` on a free loopback port, a Redis
Cluster shared by the tests that only need a working one, and the tier factories the
contract suite runs against."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tier_helpers import (
    GEOMETRY,
    REDIS_SERVER,
    SLOT,
    RedisServer,
    TierFactory,
)

from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.lower import LowerTier
from kvtier.tiers.redis.tier import RedisTier
from redis_cluster import HAVE_CLUSTER_TOOLS, LocalRedisCluster

needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None,
    reason="redis-server is not on PATH (CI installs Debian's redis-server package)",
)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh server for one test, killed at teardown."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not on PATH (CI installs Debian's redis-server package)")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """One healthy Redis Cluster for every test that does not break it (each test keeps
    to a namespace of its own); tests that kill or pause nodes use ``redis_cluster``."""
    if not HAVE_CLUSTER_TOOLS:
        pytest.skip("redis-server/redis-cli not on PATH (CI installs Debian's redis-server)")
    with LocalRedisCluster(tmp_path_factory.mktemp("shared-cluster")) as cluster:
        yield cluster


TIER_KINDS = ["disk", pytest.param("redis", marks=pytest.mark.redis),
              pytest.param("cluster", marks=pytest.mark.redis)]


@pytest.fixture(params=TIER_KINDS)
def make_tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TierFactory]:
    """Builds tiers of one kind (every kind in turn); all closed at teardown."""
    made: list[LowerTier] = []
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    cluster = request.getfixturevalue("shared_cluster") if request.param == "cluster" else None
    namespace = f"t{uuid.uuid4().hex[:12]}"

    def build(geometry: bytes = GEOMETRY, **options: object) -> LowerTier:
        tier: LowerTier
        if server is not None:
            tier = RedisTier(server.url, geometry=geometry, **options)  # type: ignore[arg-type]
        elif cluster is not None:
            tier = RedisTier(cluster_nodes=cluster.startup_nodes, namespace=namespace,
                             geometry=geometry, **options)  # type: ignore[arg-type]
        else:
            for t in made:
                t.close()  # one process may hold a directory at a time
            tier = DiskTier(tmp_path / "disk", 64 * SLOT, SLOT, geometry=geometry,
                            **options)  # type: ignore[arg-type]
        made.append(tier)
        return tier

    yield build
    for t in made:
        t.close()
