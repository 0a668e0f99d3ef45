"""The shared Redis tier: chunks as values under namespaced keys on a Redis server or a
Redis Cluster (or Valkey).

Every kvtier process pointed at one server or cluster (and one ``namespace``) shares its
chunks: the value of ``<namespace>:<key hex>`` is the chunk's record
(``kvtier.tiers.records.format``), verified on every read exactly like the disk tier's files.
Reads and writes are batched: one pipelined round trip per node per call. One server and a
cluster take the same path (``kvtier.tiers.redis.conn``, ``.links``): a batch is split by node, the
nodes are asked at once, ``MOVED`` and ``ASK`` are followed.

Faults never propagate. Every socket operation is bounded by ``timeout_s``; redis-py's own
retries are off, so a call fails fast. A node that fails (down, slow, paused, restarted, a
wrong password) is counted in ``stats.errors``, answers misses for its keys (or refuses
their writes), says why in ``last_error`` (and one log warning), and starts a backoff for
that node alone: for ``Backoff.delay(n)`` seconds after its n-th consecutive failure the
tier does not contact it (``might_hold`` is False for its keys, each call that would is
counted in ``stats.skipped``); the next call after that reconnects. The other nodes of a
cluster keep serving their keys. The clock is injected, so tests need no sleeping. A reply
refused for one key only (a value of another Redis type under a chunk's name, a write
refused for memory) costs that key alone: the call answers the rest, and no backoff starts.

The URL or the cluster's start-up nodes are checked when the tier is built
(``redis_options``), and printed only redacted (``url``): a password may be in them or
given apart (``password``).

Memory limits and eviction are the server's: set ``maxmemory`` and a ``maxmemory-policy``
such as ``allkeys-lru`` on the server (docs/tiers.md). kvtier never deletes other
processes' chunks except ones that fail verification.

``redis`` (the ``kvtier[redis]`` extra) is imported on first use, so the core installs
without it. No thread or connection starts before the first call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeGuard

from kvtier.keys import ChunkKey
from kvtier.tiers.config import check_number
from kvtier.tiers.lower import AsyncTwins, Demote, Item, TierStats, Workers, copied_into
from kvtier.tiers.records.format import RecordError, decode, decode_parts, encode_pair
from kvtier.tiers.records.seal import Seal
from kvtier.tiers.redis.conn import Backoff, Nodes, Reply, Unreached
from kvtier.tiers.redis.each import Each, Landed, checkout, next_reply
from kvtier.tiers.redis.guard import UnusableReply, bound_connection
from kvtier.tiers.redis.into import GetInto
from kvtier.tiers.redis.links import ClusterLink, Link, ServerLink, redis_module
from kvtier.tiers.redis.options import (
    DEFAULT_URL,
    MAX_TIMEOUT_S,
    MAX_TTL_S,
    check_cluster_namespace,
    check_cluster_nodes,
    check_url,
    hide,
    redact,
    secrets_of,
)
from kvtier.tiers.redis.quiet import unwatch, watch

__all__ = ["Backoff", "RedisTier"]


class RedisTier(AsyncTwins):
    """Chunks under ``<namespace>:`` on the Redis server at ``url`` (default
    ``redis://127.0.0.1:6379/0``) or on the Redis Cluster that ``cluster_nodes`` (some of
    its nodes: ``host:port`` or URLs) lead to (module docstring); ``username`` and
    ``password`` log in when the URLs do not (``RedisConfig.password`` reads one from a
    file or the environment)."""

    name = "redis"

    def __init__(
        self, url: str | None = None, *, cluster_nodes: Sequence[str] | None = None,
        namespace: str = "kvtier", geometry: bytes = b"", timeout_s: float = 0.5,
        backoff: Backoff | None = None, ttl_s: int | None = None, workers: int = 2,
        clock: Callable[[], float] = time.monotonic, username: str | None = None,
        password: str | None = None, seal: Seal | None = None,
    ) -> None:
        _check(namespace, timeout_s, ttl_s)
        login = {"username": username, "password": password}
        opened, self.url, secrets = _address(url, cluster_nodes, login, timeout_s)
        if cluster_nodes is not None:
            check_cluster_namespace(namespace, "redis tier: namespace")
        """The server's URL, or ``cluster <node>, <node>, ...``, as printed: any password
        in it shows as ``***``."""
        self.namespace, self.geometry = namespace, geometry
        self.seal = seal
        """Authenticates (or encrypts) records (``kvtier.tiers.records.seal``); None: crc32 only."""
        self.timeout_s, self.ttl_s = timeout_s, ttl_s
        self.backoff = backoff or Backoff()
        self.stats = TierStats(self.name)
        self._workers = Workers(self.name, workers)
        self._nodes = Nodes(opened, self.backoff, clock, self.stats, self.url, timeout_s,
                            partial(hide, secrets=secrets))
        self._secrets = secrets
        watch(secrets)  # and from redis-py's own log records (kvtier.tiers.redis.quiet)

    # ---- health ------------------------------------------------------------------------

    def might_hold(self, key: ChunkKey) -> bool:
        """True unless the node holding ``key`` is backing off after errors (no I/O)."""
        return self._nodes.up(self._name(key))

    @property
    def healthy(self) -> bool:
        """Whether the last call to every node reached it."""
        return self._nodes.health.healthy

    @property
    def last_error(self) -> str | None:
        """Why the last failed call or refused reply failed (one line, no secret)."""
        return self._nodes.last_error

    def _refused(self, errors: Sequence[Exception]) -> None:
        """Count a call some of whose replies the server refused (no backoff: it answers)."""
        if errors:
            self._nodes.last_error = self._nodes.hide(
                f"the server refused {len(errors)} of the call's keys: {errors[0]}")
            self.stats.add(errors=1)

    def _name(self, key: ChunkKey) -> str:
        return f"{self.namespace}:{key.hex()}"

    # ---- reads -------------------------------------------------------------------------

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        """The verified payloads of the ``keys`` the server holds; corrupt ones (any value
        that is not this key's record, of any Redis type) are deleted."""
        if not keys:
            return {}
        names = [self._name(k) for k in keys]
        return self._read(keys, Each("GET", names), None)

    def get_into(self, keys: Sequence[ChunkKey], views: Sequence[memoryview]
                 ) -> dict[ChunkKey, memoryview]:
        """``get``, each value read off the socket straight into its entry of ``views``
        (writable bytes, the host slots a promotion fills; ``kvtier.tiers.redis.into``), not
        into a bytes object the caller copies again; the payloads returned are views of
        ``views``. A view whose key is not returned holds bytes that mean nothing; a value
        longer than its view's record is no record of this layout (corrupt). A sealed tier
        (its payload is opened into new bytes) reads as ``get`` and copies."""
        if len(views) != len(keys):
            raise ValueError(f"redis tier: get_into needs one view per key ({len(keys)} keys,"
                             f" {len(views)} views)")
        if self.seal is not None or not keys:
            return copied_into(self.get(keys), keys, views)
        names = [self._name(k) for k in keys]
        return self._read(keys, GetInto("GET", names, views), views)

    def _read(self, keys: Sequence[ChunkKey], command: Each,
              views: Sequence[memoryview] | None) -> dict[ChunkKey, memoryview]:
        """``command``'s GETs of ``keys``, verified (in ``views`` where it read into them),
        corrupt values deleted, the call counted."""
        start = time.perf_counter()
        values = _as("GET", (Landed, bytes, type(None)), self._nodes.call(command.names, command))
        if _none_reached(values):
            self.stats.add(misses=len(keys))
            return {}
        out, corrupt = self._verify(keys, values, views)
        self._refused([v for v in values if _refusal(v) and not _wrong_type(v)])
        if corrupt:
            self.remove(corrupt)
        self.stats.add(
            hits=len(out), misses=len(keys) - len(out) - len(corrupt), corrupt=len(corrupt),
            bytes_read=sum(v.nbytes for v in out.values()), reads=1,
            read_seconds=time.perf_counter() - start,
        )
        return out

    def exists(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Whether the server holds each key, in one round trip per node that reads no
        payload (not verified: a corrupt copy exists until a ``get`` drops it). False for
        the keys of a node that is backing off or failed."""
        if not keys:
            return []
        names = [self._name(k) for k in keys]
        replies = _as("EXISTS", (int,), self._nodes.call(names, Each("EXISTS", names)))
        self._refused([r for r in replies if _refusal(r)])
        return [isinstance(n, int) and n > 0 for n in replies]

    def _verify(
        self, keys: Sequence[ChunkKey], values: list[Reply],
        views: Sequence[memoryview] | None = None,
    ) -> tuple[dict[ChunkKey, memoryview], list[ChunkKey]]:
        """The payloads of ``values`` that are ``keys``' records, and the keys whose value is
        not (another Redis type, or bytes that fail verification); a value ``Landed`` in its
        entry of ``views`` is verified there (a bytes value is copied there once verified)."""
        out: dict[ChunkKey, memoryview] = {}
        corrupt: list[ChunkKey] = []
        for i, (k, raw) in enumerate(zip(keys, values, strict=True)):
            if isinstance(raw, Exception):
                if _wrong_type(raw):
                    corrupt.append(k)
                continue
            try:
                if isinstance(raw, Landed) and views is not None:
                    if not raw.fits:
                        raise RecordError("value longer than a record of this layout")
                    out[k] = decode_parts(raw.head, views[i][: raw.body], k, self.geometry)
                elif isinstance(raw, bytes):
                    payload = decode(raw, k, self.geometry, self.seal)
                    if views is not None:
                        if payload.nbytes > views[i].nbytes:
                            raise RecordError("value longer than a record of this layout")
                        views[i][: payload.nbytes] = payload
                        payload = views[i][: payload.nbytes]
                    out[k] = payload
            except RecordError:
                corrupt.append(k)
        return out, corrupt

    # ---- writes ------------------------------------------------------------------------

    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        """Write ``items`` in one round trip per node; the keys written (not those of a
        node that failed or refused them). Each node's records are encoded on its own
        thread, so a cluster's checksums are computed in parallel."""
        if not items:
            return []
        start = time.perf_counter()
        names = [self._name(k) for k, _ in items]
        records: dict[int, Outgoing] = {}  # filled per node, each index by one thread

        def send(client: Any, indexes: Sequence[int], asking: bool) -> list[Reply]:
            for i in indexes:
                if i not in records:
                    k, p = items[i]
                    records[i] = (names[i].encode(), *encode_pair(k, self.geometry, p, self.seal))
            return _set_many(client, [records[i] for i in indexes], self.ttl_s, asking)

        replies = self._nodes.call(names, send)
        if _none_reached(replies):
            self.stats.add(refused=len(items))
            return []
        self._refused([r for r in replies if _refusal(r)])
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
            names = [self._name(k) for k in keys]
            self._nodes.call(names, Each("DEL", names))

    def set_demote(self, demote: Demote | None) -> None:
        """The last tier: the server evicts by its own policy, nothing goes further down."""

    # ---- asynchronous twins, checks, close ---------------------------------------------

    def check_invariants(self) -> None:
        self._nodes.health.check()

    def close(self) -> None:
        """Finish queued work, stop the workers and close the connections."""
        self._workers.close()
        self._nodes.close()
        secrets, self._secrets = self._secrets, ()
        unwatch(secrets)


def _address(
    url: str | None, cluster_nodes: Sequence[str] | None, login: dict[str, str | None],
    timeout_s: float,
) -> tuple[Callable[[], Link], str, tuple[str, ...]]:
    """How to open the tier's link (one server or a cluster), its printable address, and
    the secrets it sends; ``ValueError`` for a bad URL or node, or for both given."""
    where = {"username": login["username"] is not None, "password": login["password"] is not None}
    options = {**login, "socket_timeout": timeout_s, "socket_connect_timeout": timeout_s,
               "socket_read_size": READ_SIZE, "redis_connect_func": bound_connection}
    if cluster_nodes is None:
        url = check_url(DEFAULT_URL if url is None else url, "redis tier: url", **where)
        secrets = secrets_of([url], login["password"])
        return (lambda: ServerLink(url, options)), redact(url), secrets
    if url is not None:
        raise ValueError("redis tier: give url (one server) or cluster_nodes, not both")
    urls = check_cluster_nodes(cluster_nodes, "redis tier: cluster_nodes", **where)
    return ((lambda: ClusterLink(urls, options)), "cluster " + ", ".join(map(redact, urls)),
            secrets_of(urls, login["password"]))


def _none_reached(replies: Sequence[Reply]) -> bool:
    """Whether no node of a call answered (every reply is ``UNREACHED``)."""
    return all(isinstance(r, Unreached) for r in replies)


def _refusal(reply: Reply) -> TypeGuard[Exception]:
    """Whether ``reply`` is the server's refusal of its key (not an unreached node)."""
    return isinstance(reply, Exception) and not isinstance(reply, Unreached)


def _wrong_type(error: Exception) -> bool:
    """Whether ``error`` says the name holds another Redis type than a string."""
    return str(error).startswith("WRONGTYPE")


READ_SIZE = 1 << 20
"""Bytes asked of the socket per read (redis-py's default: 64 KiB). A reply is megabytes;
each read gives the GIL back and must win it again, which, beside a thread that holds it
(an engine's stepping loop), takes up to the switch interval (5 ms): a promotion of 15 MiB
waited a second in 64 KiB reads."""

Outgoing = tuple[bytes, bytes, memoryview]
"""A chunk on its way to the server: its name, its record header and its payload."""


def _set_many(
    client: Any, records: Sequence[Outgoing], ttl_s: int | None, asking: bool = False
) -> list[Reply]:
    """One round trip: SET each name to its record (header, then payload), expiring after
    ``ttl_s`` if given (``ASKING`` before each when redirected so); per record, None if
    written or the server's refusal (out of memory, ``MOVED``).

    redis-py takes a value as one argument, so the record would first have to be joined
    into one buffer: a copy of every payload, the main cost of a write after crc32. Instead
    each SET is written in the Redis protocol here, its value announced with the record's
    full length and sent as two buffers straight from where they lie. It is still one
    command, so it is atomic for readers: Redis runs a command only once all of its bytes
    have arrived. Any failure closes the connection, so the server drops a command cut short
    and the pool never gets back a connection with replies left unread."""
    pool = client.connection_pool
    conn = checkout(pool)
    try:
        ask = [_ASKING] if asking else []
        conn.send_packed_command([b for r in records for b in (*ask, *_set_command(*r, ttl_s))])
        refused = redis_module().ResponseError
        return [_written(next_reply(conn, refused, asking)) for _ in records]
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


_ASKING = b"*1\r\n$6\r\nASKING\r\n"


def _written(reply: Reply) -> Exception | None:
    """None for a SET the server did (``OK``), else why not: its refusal, or a reply that
    is no answer to a SET."""
    if isinstance(reply, Exception):
        return reply
    return None if reply in (b"OK", "OK") else _odd("SET", reply)


def _odd(command: str, reply: object) -> UnusableReply:
    """A reply of a type ``command`` never gets from Redis (a server that is not Redis, or
    not well): a refusal of its name."""
    return UnusableReply(f"the server answered {command} with a {type(reply).__name__}")


def _as(command: str, kinds: tuple[type, ...], replies: list[Reply]) -> list[Reply]:
    """``replies``, each not of ``kinds`` (nor an error) as ``_odd``."""
    return [r if isinstance(r, (*kinds, Exception)) else _odd(command, r) for r in replies]


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


def _check(namespace: str, timeout_s: float, ttl_s: int | None) -> None:
    if not isinstance(namespace, str) or not namespace or any(c.isspace() for c in namespace):
        raise ValueError(f"redis tier: namespace must be a non-empty word, got {namespace!r}")
    check_number("redis tier: timeout_s", timeout_s, low=1e-3, high=MAX_TIMEOUT_S)
    if ttl_s is not None:
        check_number("redis tier: ttl_s", ttl_s, low=1, high=MAX_TTL_S, integer=True)
