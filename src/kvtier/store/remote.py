"""The shared Redis tier: chunks as values under namespaced keys on a Redis server.

Every kvtier process pointed at one server (and one ``namespace``) shares its chunks: the
value of ``<namespace>:<key hex>`` is the chunk's record (``kvtier.store.record``), verified
on every read exactly like the disk tier's files. Reads and writes are batched into one
pipelined round trip per call.

Faults never propagate. Every socket operation is bounded by ``timeout_s``; redis-py's own
retries are off, so a call fails fast. A failed call (server down, slow, restarted) is
counted in ``stats.errors``, answers misses (or refuses the writes), and starts a backoff:
for ``Backoff.delay(n)`` seconds after the n-th consecutive failure the tier does not touch
the network at all (``might_hold`` is False, calls are counted in ``stats.skipped``); the
next call after that reconnects. The clock is injected, so tests need no sleeping.

Memory limits and eviction are the server's: set ``maxmemory`` and a ``maxmemory-policy``
such as ``allkeys-lru`` on the server (docs/tiers.md). kvtier never deletes other
processes' chunks except ones that fail verification.

``redis`` (the ``kvtier[redis]`` extra) is imported on first use, so the core installs
without it. No thread or connection starts before the first call.

>>> Backoff(initial_s=0.1, max_s=1.0).delay(1), Backoff(initial_s=0.1, max_s=1.0).delay(5)
(0.1, 1.0)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from kvtier.keys import ChunkKey
from kvtier.store.lower import Demote, Item, TierStats, Workers
from kvtier.store.record import RecordError, decode, encode

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """How long to leave the server alone after consecutive failures: ``initial_s``,
    doubling (``factor``) up to ``max_s``."""

    initial_s: float = 0.1
    max_s: float = 10.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.initial_s <= self.max_s or self.factor < 1:
            raise ValueError(
                "backoff: need 0 <= initial_s <= max_s and factor >= 1, got "
                f"initial_s={self.initial_s}, max_s={self.max_s}, factor={self.factor}"
            )

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` (>= 1) consecutive failures."""
        return float(min(self.max_s, self.initial_s * self.factor ** (failures - 1)))


def _redis_module() -> Any:
    try:
        import redis
    except ImportError:
        raise ImportError(
            "the Redis tier needs redis-py: pip install 'kvtier[redis]'"
        ) from None
    return redis


class RedisTier:
    """Chunks on a Redis server at ``url`` under ``<namespace>:`` (module docstring)."""

    name = "redis"

    def __init__(
        self, url: str = "redis://127.0.0.1:6379/0", *, namespace: str = "kvtier",
        geometry: bytes = b"", timeout_s: float = 0.5, backoff: Backoff | None = None,
        ttl_s: int | None = None, workers: int = 2, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check(url, namespace, timeout_s, ttl_s)
        self.url, self.namespace, self.geometry = url, namespace, geometry
        self.timeout_s, self.ttl_s = timeout_s, ttl_s
        self.backoff = backoff or Backoff()
        self.stats = TierStats(self.name)
        self._clock = clock
        self._workers = Workers(self.name, workers)
        self._client: Any = None
        self._lock = threading.Lock()  # guards the client and the failure count
        self._scratch = threading.local()
        self._failures = 0
        self._retry_at = float("-inf")

    # ---- health ------------------------------------------------------------------------

    def might_hold(self, key: ChunkKey) -> bool:
        """True unless the tier is backing off after errors (no I/O)."""
        return self._up()

    def _up(self) -> bool:
        return self._clock() >= self._retry_at

    @property
    def healthy(self) -> bool:
        """Whether the last call reached the server."""
        return self._failures == 0

    def _connection(self) -> Any:
        with self._lock:
            if self._client is None:
                redis = _redis_module()
                self._client = redis.Redis.from_url(
                    self.url, socket_timeout=self.timeout_s,
                    socket_connect_timeout=self.timeout_s,
                    retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
                )
            return self._client

    def _run(self, call: Callable[[Any], T]) -> T | None:
        """``call(client)``, or None when backing off or when it failed (counted)."""
        if not self._up():
            self.stats.add(skipped=1)
            return None
        redis = _redis_module()
        try:
            result = call(self._connection())
        except (redis.RedisError, OSError):
            with self._lock:
                self._failures += 1
                self._retry_at = self._clock() + self.backoff.delay(self._failures)
            self.stats.add(errors=1)
            return None
        with self._lock:
            self._failures, self._retry_at = 0, float("-inf")
        return result

    def _name(self, key: ChunkKey) -> str:
        return f"{self.namespace}:{key.hex()}"

    # ---- reads -------------------------------------------------------------------------

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        """The verified payloads of the ``keys`` the server holds; corrupt ones are deleted."""
        if not keys:
            return {}
        start = time.perf_counter()
        names = [self._name(k) for k in keys]
        values = self._run(lambda c: _get_many(c, names))
        if values is None:
            self.stats.add(misses=len(keys))
            return {}
        out, corrupt = self._verify(keys, values)
        if corrupt:
            self._run(lambda c: c.delete(*[self._name(k) for k in corrupt]))
        self.stats.add(
            hits=len(out), misses=len(keys) - len(out) - len(corrupt), corrupt=len(corrupt),
            bytes_read=sum(v.nbytes for v in out.values()), reads=1,
            read_seconds=time.perf_counter() - start,
        )
        return out

    def _verify(
        self, keys: Sequence[ChunkKey], values: list[bytes | None]
    ) -> tuple[dict[ChunkKey, memoryview], list[ChunkKey]]:
        out: dict[ChunkKey, memoryview] = {}
        corrupt: list[ChunkKey] = []
        for k, raw in zip(keys, values, strict=True):
            if raw is None:
                continue
            try:
                out[k] = decode(raw, k, self.geometry)
            except RecordError:
                corrupt.append(k)
        return out, corrupt

    # ---- writes ------------------------------------------------------------------------

    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        """Write ``items`` in one round trip; the keys written (none if the call failed)."""
        if not items:
            return []
        start = time.perf_counter()
        records = self._records(items)
        done = self._run(lambda c: _set_many(c, records, self.ttl_s))
        if done is None:
            self.stats.add(refused=len(items))
            return []
        self.stats.add(
            stored=len(items), bytes_written=sum(r.nbytes for _, r in records), writes=1,
            write_seconds=time.perf_counter() - start,
        )
        return [k for k, _ in items]

    def _records(self, items: Sequence[Item]) -> list[tuple[str, memoryview]]:
        """Each item's record, laid out in this thread's scratch buffer: reused warm memory,
        because a fresh multi-megabyte buffer per call costs more in page faults than the
        copy itself. Valid until this thread's next ``put``."""
        parts = [encode(k, self.geometry, p) for k, p in items]
        need = sum(len(h) + v.nbytes for h, v in parts)
        scratch = getattr(self._scratch, "buf", None)
        if scratch is None or len(scratch) < need:
            scratch = self._scratch.buf = bytearray(need)
        view, out, at = memoryview(scratch), [], 0
        for (k, _), (head, payload) in zip(items, parts, strict=True):
            end = at + len(head) + payload.nbytes
            view[at : at + len(head)] = head
            view[at + len(head) : end] = payload
            out.append((self._name(k), view[at:end]))
            at = end
        return out

    def remove(self, keys: Sequence[ChunkKey]) -> None:
        """Delete ``keys`` on the server (best effort: a failed call is only counted)."""
        if keys:
            self._run(lambda c: c.delete(*[self._name(k) for k in keys]))

    def set_demote(self, demote: Demote | None) -> None:
        """The last tier: the server evicts by its own policy, nothing goes further down."""

    # ---- asynchronous twins, checks, close ---------------------------------------------

    def get_async(self, keys: Sequence[ChunkKey]) -> Future[dict[ChunkKey, memoryview]]:
        return self._workers.submit(self.get, list(keys))

    def put_async(self, items: Sequence[Item]) -> Future[list[ChunkKey]]:
        return self._workers.submit(self.put, list(items))

    def remove_async(self, keys: Sequence[ChunkKey]) -> Future[None]:
        return self._workers.submit(self.remove, list(keys))

    def check_invariants(self) -> None:
        if self._failures < 0:
            raise AssertionError("negative failure count")

    def close(self) -> None:
        """Finish queued work, stop the workers and close the connections."""
        self._workers.close()
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _get_many(client: Any, names: Sequence[str]) -> list[bytes | None]:
    """One round trip: GET each name."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    return list(pipe.execute())


def _set_many(client: Any, records: Sequence[tuple[str, memoryview]], ttl_s: int | None) -> bool:
    """One round trip: SET each (name, record), expiring after ``ttl_s`` if given."""
    pipe = client.pipeline(transaction=False)
    for name, record in records:
        pipe.set(name, record, ex=ttl_s)
    return all(pipe.execute())


def _check(url: str, namespace: str, timeout_s: float, ttl_s: int | None) -> None:
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(
            f"redis tier: url must look like redis://host:port/db (or rediss://, unix://), "
            f"got {url!r}"
        )
    if not namespace or any(c.isspace() for c in namespace):
        raise ValueError(f"redis tier: namespace must be a non-empty word, got {namespace!r}")
    if not timeout_s > 0:
        raise ValueError(f"redis tier: timeout_s must be > 0, got {timeout_s!r}")
    if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s < 1):
        raise ValueError(f"redis tier: ttl_s must be a positive integer or None, got {ttl_s!r}")
