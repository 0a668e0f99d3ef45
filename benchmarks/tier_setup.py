"""What ``benchmarks/tiers.py`` runs on: its chunks and batches, how it times them, and the
private Redis server and Redis Cluster it starts when none is given. A helper of that
benchmark, not a benchmark itself (``benchmarks/run_quick.py``, ``HELPERS``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kvtier.keys import ChunkKey

CHUNK = 2 << 20
BATCH = 8

Item = tuple[ChunkKey, bytes]


def make_items(n: int) -> list[Item]:
    return [(ChunkKey(i.to_bytes(40, "big")), os.urandom(CHUNK)) for i in range(n)]


def batches(items: list[Item]) -> Iterator[list[Item]]:
    for i in range(0, len(items), BATCH):
        yield items[i : i + BATCH]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def read_batches(get: Callable[[list[ChunkKey]], object], keys: list[ChunkKey]) -> None:
    """Read ``keys`` a batch at a time, dropping each result as the bare loops do."""
    for i in range(0, len(keys), BATCH):
        get(keys[i : i + BATCH])


@contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    """``url``, or a private server on a free loopback port for the run."""
    if url is not None:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH; install it or pass --redis-url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", d],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_ping(port)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.kill()
            proc.wait()


def _wait_for_ping(port: int) -> None:
    import redis

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if redis.Redis(port=port, socket_timeout=0.2).ping():
                return
        except redis.RedisError:
            time.sleep(0.02)
    raise SystemExit(f"redis-server on port {port} did not answer PING")


@contextmanager
def redis_cluster(nodes: str | None) -> Iterator[list[str]]:
    """``nodes`` (comma-separated), or a private three-master cluster for the run."""
    if nodes is not None:
        yield nodes.split(",")
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from redis_cluster import HAVE_CLUSTER_TOOLS, LocalRedisCluster

    if not HAVE_CLUSTER_TOOLS:
        raise SystemExit("redis-server/redis-cli not on PATH; install or pass --cluster-nodes")
    with tempfile.TemporaryDirectory() as d, LocalRedisCluster(Path(d)) as cluster:
        yield cluster.startup_nodes
