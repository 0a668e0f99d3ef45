"""Fixtures of the tier tests: a private ``redis-server`` on a free loopback port, and the
tier factories the contract suite runs against."""

from __future__ import annotations

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

from kvtier.store.disk import DiskTier
from kvtier.store.lower import LowerTier
from kvtier.store.remote import RedisTier

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




@pytest.fixture(params=["disk", pytest.param("redis", marks=pytest.mark.redis)])
def make_tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TierFactory]:
    """Builds tiers of one kind (every kind in turn); all closed at teardown."""
    made: list[LowerTier] = []
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None

    def build(geometry: bytes = GEOMETRY, **options: object) -> LowerTier:
        tier: LowerTier
        if server is not None:
            tier = RedisTier(server.url, geometry=geometry, **options)  # type: ignore[arg-type]
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
