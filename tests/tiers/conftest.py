"""Fixtures of the tier tests: a private ``redis-server`` on a free loopback port, and the
tier factories the contract suite runs against."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tier_helpers import GEOMETRY, SLOT, free_port, poll

from kvtier.store.disk import DiskTier
from kvtier.store.lower import LowerTier
from kvtier.store.remote import RedisTier

REDIS_SERVER = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None,
    reason="redis-server is not on PATH (CI installs Debian's redis-server package)",
)


class RedisServer:
    """A ``redis-server`` of our own: no persistence, loopback only, stoppable."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port = workdir, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        if not poll(self.ping, timeout_s=10.0):
            self.stop()
            raise RuntimeError(f"redis-server did not answer PING on port {self.port}")

    def ping(self) -> bool:
        import redis

        try:
            with redis.Redis(port=self.port, socket_timeout=0.2,
                             socket_connect_timeout=0.2) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def client(self) -> object:
        import redis

        return redis.Redis(port=self.port, socket_timeout=2)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh server for one test, killed at teardown."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not on PATH (CI installs Debian's redis-server package)")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


TierFactory = Callable[..., LowerTier]


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
