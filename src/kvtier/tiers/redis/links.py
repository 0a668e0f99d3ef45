"""How the Redis tier reaches its nodes: one server or a Redis Cluster, one code path.

A *link* says which node holds each name of a call (``route``) and hands out a redis-py
client per node (``client``). ``ServerLink`` has one node that holds everything;
``ClusterLink`` asks redis-py's ``NodesManager`` for the cluster's slot map (a name's hash
slot, CRC16 mod 16384, decides its node) and follows it as it changes. Valkey speaks the
same protocol, so both serve Valkey too. ``kvtier.tiers.redis.conn`` calls the nodes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol
from urllib.parse import urlsplit

from kvtier.tiers.lower import Workers
from kvtier.tiers.redis.guard import PARSE_ERRORS, UnusableReply, call_deadline, parsed

_log = logging.getLogger("kvtier.tiers.redis.tier")  # the tier's: its users filter by it

def redis_module() -> Any:
    """redis-py, or an ImportError saying how to install it."""
    try:
        import redis
    except ImportError:
        raise ImportError(
            "the Redis tier needs redis-py: pip install 'kvtier[redis]'"
        ) from None
    return redis


class Link(Protocol):
    """One server or a cluster, as ``Nodes`` sees it (module docstring)."""

    def route(self, names: Sequence[str]) -> dict[str, list[int]]:
        """Node -> indexes of the ``names`` it holds (no I/O); a name in a slot no node
        serves is left out."""
        ...

    def client(self, node: str) -> Any:
        """The redis-py client of ``node``."""
        ...

    def redirected(self, error: Exception) -> str | None:
        """The node a ``MOVED`` / ``ASK`` reply sends a name to (None: not followed)."""
        ...

    def failed(self, node: str) -> None:
        """``node`` did not answer: the cluster may have changed."""
        ...

    def run(self, jobs: Sequence[Callable[[], None]]) -> None:
        """Run ``jobs`` (one per node) and return when all have finished."""
        ...

    def close(self) -> None: ...


def _no_retry(redis: Any) -> Any:
    return redis.retry.Retry(redis.backoff.NoBackoff(), 0)


class ServerLink:
    """One server: one node, named ``"server"``, holds every name."""

    node = "server"

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        redis = redis_module()
        self._client = redis.Redis.from_url(url, **options, retry=_no_retry(redis))

    def route(self, names: Sequence[str]) -> dict[str, list[int]]:
        return {self.node: list(range(len(names)))}

    def client(self, node: str) -> Any:
        return self._client

    def redirected(self, error: Exception) -> str | None:
        return None  # a server outside a cluster does not redirect

    def failed(self, node: str) -> None:
        """Nothing to learn: the next call reconnects."""

    def run(self, jobs: Sequence[Callable[[], None]]) -> None:
        for job in jobs:
            job()

    def close(self) -> None:
        self._client.close()


class ClusterLink:
    """A Redis Cluster found from its start-up node URLs (``check_cluster_nodes``, so
    they share one connection setup). Building it reads the slot map from the first
    start-up node that answers (any one will do, so a dead master costs only its slots);
    it fails only when none answers (``Nodes`` then backs off as for a failed node).

    redis-py's ``NodesManager`` keeps the slot map and one client per node; its
    ``RedisCluster`` is not used, because building one also asks the map's first master
    for the server's command table and fails outright while that master is down."""

    def __init__(self, urls: Sequence[str], options: dict[str, Any]) -> None:
        redis = redis_module()
        settings = {**options, **redis.connection.parse_url(urls[0])}
        startup = [redis.cluster.ClusterNode(p.hostname, p.port)
                   for p in map(urlsplit, urls)]
        with parsed():  # it reads the slot map: a reply that cannot be read fails the link
            self._nodes = redis.cluster.NodesManager(
                startup_nodes=startup, require_full_coverage=False,
                **redis.cluster.cleanup_kwargs(**settings),
            )  # its node clients never retry a call themselves
        self._timeout_s = float(options["socket_timeout"])
        self._startup = startup
        self._lock = threading.Lock()
        self._jobs = Workers("redis-nodes", 16)
        self._refreshing: Future[None] | None = None

    def route(self, names: Sequence[str]) -> dict[str, list[int]]:
        nodes, slot = self._nodes, redis_module().crc.key_slot
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            try:
                node = nodes.get_node_from_slot(slot(name.encode()))
            except redis_module().exceptions.SlotNotCoveredError:
                continue
            groups.setdefault(node.name, []).append(i)
        return groups

    def client(self, node: str) -> Any:
        with parsed():  # a node's name comes from the servers
            found = self._nodes.get_node(node_name=node)
            if found is None:  # a node learnt from a redirection only
                host, _, port = node.rpartition(":")
                found = redis_module().cluster.ClusterNode(host, int(port))
            if found.redis_connection is None:
                with self._lock:
                    if found.redis_connection is None:
                        self._nodes.create_redis_connections([found])
        return found.redis_connection

    def redirected(self, error: Exception) -> str | None:
        """The node of a redirection that names a slot and an address that can be (a server
        chooses them: others are not followed)."""
        redis = redis_module()
        if not isinstance(error, redis.exceptions.AskError) or not _addressable(error):
            return None
        if isinstance(error, redis.exceptions.MovedError):
            try:
                self._moved(error)
            except PARSE_ERRORS:  # a slot map redis-py cannot update: read it afresh
                self.failed("")
        return f"{error.host}:{error.port}"

    def _moved(self, error: Exception) -> None:
        """Point the slot of a ``MOVED`` reply at its new node (redis-py >= 6 does it in
        place; older ones re-read the whole slot map)."""
        nodes = self._nodes
        if hasattr(nodes, "move_slot"):
            nodes.move_slot(error)
        else:
            self.failed("")

    def failed(self, node: str) -> None:
        """Re-read the slot map in the background (one refresh at a time, whichever
        threads report failures: the nodes of one call fail on threads of their own)."""
        with self._lock:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = self._jobs.submit(self._refresh)

    def _refresh(self) -> None:
        redis = redis_module()
        try:
            # the start-up nodes stay among those asked: redis-py replaces them with the
            # nodes of the last slot map, which a hostile or broken node may have filled
            # with addresses that never answer
            self._nodes.startup_nodes.update({n.name: n for n in self._startup})
            with call_deadline(time.monotonic() + self._timeout_s), parsed():
                self._nodes.initialize()
        except (redis.RedisError, redis.exceptions.RedisClusterException, OSError,
                UnusableReply) as e:
            # kept as it was; the error's text, which a server may choose, is not printed
            _log.debug("redis cluster: slot map not refreshed (%s)", type(e).__name__)

    def run(self, jobs: Sequence[Callable[[], None]]) -> None:
        if len(jobs) == 1:
            jobs[0]()
            return
        for future in [self._jobs.submit(job) for job in jobs]:
            future.result()

    def close(self) -> None:
        self._jobs.close()
        self._nodes.reset()


SLOTS = 16384
"""A Redis Cluster's hash slots."""


def _addressable(error: Any) -> bool:
    """Whether a redirection names a slot of a cluster and a port a socket can reach."""
    slot, port = getattr(error, "slot_id", None), getattr(error, "port", None)
    return (isinstance(slot, int) and 0 <= slot < SLOTS and isinstance(port, int)
            and 0 < port < 65536 and bool(getattr(error, "host", "")))
