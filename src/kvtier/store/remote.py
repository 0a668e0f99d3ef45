"""The shared Redis tier: chunks as values under namespaced keys on a Redis server.

Every kvtier process pointed at one server (and one ``namespace``) shares its chunks: the
value of ``<namespace>:<key hex>`` is the chunk's record (``kvtier.store.record``), verified
on every read exactly like the disk tier's files. Reads and writes are batched into one
pipelined round trip per call.

Faults never propagate. Every socket operation is bounded by ``timeout_s``; redis-py's own
retries are off, so a call fails fast. A failed call (server down, slow, restarted, a wrong
password) is counted in ``stats.errors``, answers misses (or refuses the writes), says why in
``last_error`` (and one log warning), and starts a backoff: for ``Backoff.delay(n)`` seconds
after the n-th consecutive failure the tier does not touch the network at all
(``might_hold`` is False, calls are counted in ``stats.skipped``); the next call after that
reconnects. The clock is injected, so tests need no sleeping. A reply the server refuses
for one key only (a value of another Redis type under a chunk's name, a write refused for
memory) costs that key alone: the call answers the rest, and no backoff starts.

The URL is checked when the tier is built (``redis_options.check_url``), and printed only
redacted (``url``): a password may be in it or given apart (``password``).

Memory limits and eviction are the server's: set ``maxmemory`` and a ``maxmemory-policy``
such as ``allkeys-lru`` on the server (docs/tiers.md). kvtier never deletes other
processes' chunks except ones that fail verification.

``redis`` (the ``kvtier[redis]`` extra) is imported on first use, so the core installs
without it. No thread or connection starts before the first call.

>>> Backoff(initial_s=0.1, max_s=1.0).delay(1), Backoff(initial_s=0.1, max_s=1.0).delay(5)
(0.1, 1.0)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvtier.keys import ChunkKey
from kvtier.store.config import check_number
from kvtier.store.lower import AsyncTwins, Demote, Item, TierStats, Workers
from kvtier.store.record import RecordError, decode, encode_pair
from kvtier.store.redis_options import MAX_TIMEOUT_S, MAX_TTL_S, check_url, redact
from kvtier.store.seal import Seal

T = TypeVar("T")
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """How long to leave the server alone after consecutive failures: ``initial_s``,
    doubling (``factor``) up to ``max_s``."""

    initial_s: float = 0.1
    max_s: float = 10.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        check_number("backoff.initial_s", self.initial_s, low=0)
        check_number("backoff.max_s", self.max_s, low=self.initial_s)
        check_number("backoff.factor", self.factor, low=1)

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` (>= 1) consecutive failures (``max_s`` once
        the doubling would pass it, however long the server stays away)."""
        try:
            grown = self.initial_s * self.factor ** (failures - 1)
        except OverflowError:  # a server down for hours: factor ** failures leaves float
            return float(self.max_s)
        return float(min(self.max_s, grown))


def _redis_module() -> Any:
    try:
        import redis
    except ImportError:
        raise ImportError(
            "the Redis tier needs redis-py: pip install 'kvtier[redis]'"
        ) from None
    return redis


class RedisTier(AsyncTwins):
    """Chunks on a Redis server at ``url`` under ``<namespace>:`` (module docstring);
    ``username`` and ``password`` log in when the URL does not (``RedisConfig.password``
    reads one from a file or the environment)."""

    name = "redis"

    def __init__(
        self, url: str = "redis://127.0.0.1:6379/0", *, namespace: str = "kvtier",
        geometry: bytes = b"", timeout_s: float = 0.5, backoff: Backoff | None = None,
        ttl_s: int | None = None, workers: int = 2, clock: Callable[[], float] = time.monotonic,
        username: str | None = None, password: str | None = None, seal: Seal | None = None,
    ) -> None:
        check_url(url, "redis tier: url", username=username is not None,
                  password=password is not None)
        _check(namespace, timeout_s, ttl_s)
        self.url = redact(url)
        """The server's URL as printed: any password in it shows as ``***``."""
        self.namespace, self.geometry = namespace, geometry
        self.seal = seal
        """Authenticates (or encrypts) records (``kvtier.store.seal``); None: crc32 only."""
        self.timeout_s, self.ttl_s = timeout_s, ttl_s
        self.last_error: str | None = None
        """Why the last failed call or refused reply failed (one line, no secret)."""
        self._login = {"url": url, "username": username, "password": password}
        self.backoff = backoff or Backoff()
        self.stats = TierStats(self.name)
        self._clock = clock
        self._workers = Workers(self.name, workers)
        self._client: Any = None
        self._lock = threading.Lock()  # guards the client and the failure count
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
                    **self._login, socket_timeout=self.timeout_s,
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
        except (redis.RedisError, OSError) as e:
            with self._lock:
                self._failures += 1
                delay = self.backoff.delay(self._failures)
                self._retry_at = self._clock() + delay
                self.last_error = _describe(e)
                first = self._failures == 1
            self.stats.add(errors=1)
            if first:
                _log.warning("redis tier %s: %s; leaving it alone %.3g s", self.url,
                             self.last_error, delay)
            return None
        with self._lock:
            self._failures, self._retry_at = 0, float("-inf")
        return result

    def _refused(self, errors: Sequence[Exception]) -> None:
        """Count a call some of whose replies the server refused (no backoff: it answers)."""
        if errors:
            self.last_error = f"the server refused {len(errors)} of the call's keys: {errors[0]}"
            self.stats.add(errors=1)

    def _name(self, key: ChunkKey) -> str:
        return f"{self.namespace}:{key.hex()}"

    # ---- reads -------------------------------------------------------------------------

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        """The verified payloads of the ``keys`` the server holds; corrupt ones (any value
        that is not this key's record, of any Redis type) are deleted."""
        if not keys:
            return {}
        start = time.perf_counter()
        names = [self._name(k) for k in keys]
        values = self._run(lambda c: _get_many(c, names))
        if values is None:
            self.stats.add(misses=len(keys))
            return {}
        out, corrupt = self._verify(keys, values)
        self._refused([v for v in values if isinstance(v, Exception) and not _wrong_type(v)])
        if corrupt:
            self._run(lambda c: c.delete(*[self._name(k) for k in corrupt]))
        self.stats.add(
            hits=len(out), misses=len(keys) - len(out) - len(corrupt), corrupt=len(corrupt),
            bytes_read=sum(v.nbytes for v in out.values()), reads=1,
            read_seconds=time.perf_counter() - start,
        )
        return out

    def exists(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Whether the server holds each key, in one round trip that reads no payload (not
        verified: a corrupt copy exists until a ``get`` drops it). All False when backing
        off or when the call failed."""
        if not keys:
            return []
        names = [self._name(k) for k in keys]
        found = self._run(lambda c: _exists_many(c, names))
        return [bool(n) for n in found] if found is not None else [False] * len(keys)

    def _verify(
        self, keys: Sequence[ChunkKey], values: list[Reply]
    ) -> tuple[dict[ChunkKey, memoryview], list[ChunkKey]]:
        """The payloads of ``values`` that are ``keys``' records, and the keys whose value is
        not (another Redis type, or bytes that fail verification)."""
        out: dict[ChunkKey, memoryview] = {}
        corrupt: list[ChunkKey] = []
        for k, raw in zip(keys, values, strict=True):
            if isinstance(raw, Exception):
                if _wrong_type(raw):
                    corrupt.append(k)
            elif raw is not None:
                try:
                    out[k] = decode(raw, k, self.geometry, self.seal)
                except RecordError:
                    corrupt.append(k)
        return out, corrupt

    # ---- writes ------------------------------------------------------------------------

    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        """Write ``items`` in one round trip; the keys written (none if the call failed)."""
        if not items:
            return []
        start = time.perf_counter()
        records = [(self._name(k).encode(), *encode_pair(k, self.geometry, p, self.seal))
                   for k, p in items]
        replies = self._run(lambda c: _set_many(c, records, self.ttl_s))
        if replies is None:
            self.stats.add(refused=len(items))
            return []
        self._refused([r for r in replies if r is not None])
        written = [i for i, r in enumerate(replies) if r is None]
        self.stats.add(
            stored=len(written), refused=len(items) - len(written),
            bytes_written=sum(len(records[i][1]) + records[i][2].nbytes for i in written),
            writes=1, write_seconds=time.perf_counter() - start,
        )
        return [items[i][0] for i in written]

    def remove(self, keys: Sequence[ChunkKey]) -> None:
        """Delete ``keys`` on the server (best effort: a failed call is only counted)."""
        if keys:
            self._run(lambda c: c.delete(*[self._name(k) for k in keys]))

    def set_demote(self, demote: Demote | None) -> None:
        """The last tier: the server evicts by its own policy, nothing goes further down."""

    # ---- asynchronous twins, checks, close ---------------------------------------------

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


Reply = bytes | None | Exception
"""One GET's reply: the value, None (no such key), or the server's error for that key."""


def _get_many(client: Any, names: Sequence[str]) -> list[Reply]:
    """One round trip: GET each name; a reply the server refuses (a list under the name)
    stays in its place as the exception, so that it costs its own key only."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    return list(pipe.execute(raise_on_error=False))


def _wrong_type(error: Exception) -> bool:
    """Whether ``error`` says the name holds another Redis type than a string."""
    return str(error).startswith("WRONGTYPE")


def _exists_many(client: Any, names: Sequence[str]) -> list[int]:
    """One round trip: EXISTS each name (1 or 0)."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.exists(name)
    return list(pipe.execute())


Outgoing = tuple[bytes, bytes, memoryview]
"""A chunk on its way to the server: its name, its record header and its payload."""


def _set_many(
    client: Any, records: Sequence[Outgoing], ttl_s: int | None
) -> list[Exception | None]:
    """One round trip: SET each name to its record (header, then payload), expiring after
    ``ttl_s`` if given; per record, None if written or the server's refusal (out of memory).

    redis-py takes a value as one argument, so the record would first have to be joined
    into one buffer: a copy of every payload, the main cost of a write after crc32. Instead
    each SET is written in the Redis protocol here, its value announced with the record's
    full length and sent as two buffers straight from where they lie. It is still one
    command, so it is atomic for readers: Redis runs a command only once all of its bytes
    have arrived. Any failure closes the connection, so the server drops a command cut short
    and the pool never gets back a connection with replies left unread."""
    pool = client.connection_pool
    conn = _checkout(pool)
    try:
        conn.send_packed_command([b for r in records for b in _set_command(*r, ttl_s)])
        return [_reply(conn) for _ in records]
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def _reply(conn: Any) -> Exception | None:
    """The next reply on ``conn``: None if it is not an error, the error otherwise."""
    redis = _redis_module()
    try:
        conn.read_response()
    except redis.ResponseError as e:
        return e
    return None


def _set_command(
    name: bytes, header: bytes, payload: memoryview, ttl_s: int | None
) -> tuple[bytes, memoryview, bytes]:
    """``SET name <header + payload> [EX ttl_s]`` in the Redis protocol (RESP), as three
    buffers: everything up to the end of the header, the payload, the rest.

    >>> head, body, tail = _set_command(b"k", b"hh", memoryview(b"ppp"), 60)
    >>> head + body + tail
    b'*5\\r\\n$3\\r\\nSET\\r\\n$1\\r\\nk\\r\\n$5\\r\\nhhppp\\r\\n$2\\r\\nEX\\r\\n$2\\r\\n60\\r\\n'
    """
    extra = [] if ttl_s is None else [b"EX", str(ttl_s).encode()]
    head = b"*%d\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s" % (
        3 + len(extra), len(name), name, len(header) + payload.nbytes, header)
    return head, payload, b"\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in extra)


def _checkout(pool: Any) -> Any:
    """A connection of ``pool``, handed back with ``pool.release``."""
    try:
        return pool.get_connection()
    except TypeError:  # redis-py before 5.3 wants a command name
        return pool.get_connection("SET")


def _describe(error: BaseException) -> str:
    """One line saying why a call failed: a refused login says so, apart from a server that
    does not answer."""
    redis = _redis_module()
    if isinstance(error, redis.AuthenticationError):
        return f"authentication failed (wrong or missing username or password): {error}"
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return f"the server does not answer ({error})"
    return f"the server refused the call ({error})"


def _check(namespace: str, timeout_s: float, ttl_s: int | None) -> None:
    if not isinstance(namespace, str) or not namespace or any(c.isspace() for c in namespace):
        raise ValueError(f"redis tier: namespace must be a non-empty word, got {namespace!r}")
    check_number("redis tier: timeout_s", timeout_s, low=1e-3, high=MAX_TIMEOUT_S)
    if ttl_s is not None:
        check_number("redis tier: ttl_s", ttl_s, low=1, high=MAX_TTL_S, integer=True)
