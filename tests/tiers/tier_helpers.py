"""Helpers of the tier tests: readable keys, deterministic payloads, a clock, a writer
whose failures a test controls, and a bounded poll."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kvtier.keys import ChunkKey
from kvtier.store.backend import BytesLike
from kvtier.tiers.disk.tier import write_all
from kvtier.tiers.lower import LowerTier

SLOT = 4096
GEOMETRY = b"testgeo1"


def key(name: object) -> ChunkKey:
    """A 40-byte key named by ``name``."""
    return ChunkKey(hashlib.blake2b(str(name).encode(), digest_size=40).digest())


def payload(name: object, size: int = SLOT) -> bytes:
    """``size`` bytes that differ per ``name``."""
    seed = hashlib.blake2b(str(name).encode(), digest_size=64).digest()
    return (seed * (size // 64 + 1))[:size]


def items(names: Sequence[object], size: int = SLOT) -> list[tuple[ChunkKey, bytes]]:
    return [(key(n), payload(n, size)) for n in names]


class Clock:
    """A monotonic clock a test advances by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ControlledWriter:
    """A disk-tier writer: writes normally until ``fail_with`` is set, then raises it."""

    def __init__(self) -> None:
        self.fail_with: OSError | None = None

    def __call__(self, fd: int, buffers: Sequence[BytesLike]) -> None:
        if self.fail_with is not None:
            os.write(fd, bytes(memoryview(buffers[0])[:10]))  # a few bytes, then the failure
            raise self.fail_with
        write_all(fd, buffers)

    @staticmethod
    def disk_full() -> OSError:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def poll(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Whether ``condition()`` became true within ``timeout_s`` (a bounded poll)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


REDIS_SERVER = shutil.which("redis-server")


class RedisServer:
    """A ``redis-server`` of our own: no persistence, loopback only, stoppable; with
    ``password``, clients must log in (``--requirepass``); ``args`` go to the server too."""

    def __init__(
        self, workdir: Path, password: str | None = None, args: Sequence[str] = ()
    ) -> None:
        self.workdir, self.port = workdir, free_port()
        self.password, self.args = password, list(args)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), *self.args,
             *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        if not poll(self.ping, timeout_s=10.0):
            self.stop()
            raise RuntimeError(f"redis-server did not answer PING on port {self.port}")

    def ping(self) -> bool:
        import redis

        try:
            with redis.Redis(port=self.port, socket_timeout=0.2, password=self.password,
                             socket_connect_timeout=0.2) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def client(self) -> object:
        import redis

        return redis.Redis(port=self.port, socket_timeout=2, password=self.password)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


TierFactory = Callable[..., LowerTier]
