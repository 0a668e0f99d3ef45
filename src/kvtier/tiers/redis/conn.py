"""How the Redis tier calls its nodes, one server or a Redis Cluster alike (the links that
reach them: ``kvtier.tiers.redis.links``).

``Nodes.call`` is the one path above the links, for every command of the tier:

1. split the call's names by node; a node backing off is not contacted (its names are
   ``UNREACHED``, counted once in ``stats.skipped``);
2. send one pipeline per node, all nodes at once on a cluster, so a call lasts as long
   as its slowest node, and no longer than its deadline, ``timeout_s`` from its start,
   whatever the nodes do (``kvtier.tiers.redis.guard``; redis-py's own retries are off):
   writes from one thread per node (each checksums and sends its megabytes), reads and
   other small commands from the calling thread, every node's requests first, then the
   replies as they arrive (``kvtier.tiers.redis.each``);
3. follow ``MOVED`` (the slot moved for good: the slot map is updated) and ``ASK`` (the
   slot is migrating: ``ASKING`` first) replies once, to the node they name, if the
   deadline has not passed (a redirection not followed is a refusal of its name);
4. a node that fails (refused, timed out, wrong password, a reply that cannot be read)
   leaves its names ``UNREACHED``, is counted in ``stats.errors`` and backs off alone
   (``Backoff``): the other nodes' names are served, and on a cluster the slot map is
   refreshed in the background, in case a replica took over. A reply refused for one
   name only stays in place, for the tier to count against that name.

>>> Backoff(initial_s=0.1, max_s=1.0).delay(1), Backoff(initial_s=0.1, max_s=1.0).delay(5)
(0.1, 1.0)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from kvtier.tiers.config import check_number
from kvtier.tiers.lower import TierStats
from kvtier.tiers.redis.each import Each, Faults, Reply, run_each
from kvtier.tiers.redis.guard import UnusableReply, call_deadline, remaining, run_within
from kvtier.tiers.redis.links import Link, ServerLink, redis_module

_log = logging.getLogger("kvtier.tiers.redis.tier")  # the tier's: its users filter by it


class Unreached(Exception):
    """In place of the reply for a name whose node was not reached (down, backing off, no
    connection): a miss or an unwritten chunk, not a fault of that name."""


UNREACHED = Unreached("the node holding this key was not reached")

Command = Callable[[Any, Sequence[int], bool], list[Reply]]
"""Sends one node's share of a call on its own thread: ``command(client, indexes, asking)``
returns one reply per index (``asking``: send ``ASKING`` before each, for an ``ASK``
redirection). Small commands are an ``Each`` instead (``kvtier.tiers.redis.each``)."""

CONNECT = "(connect)"
"""The health entry of the link itself: building it (a cluster's first topology) failed."""


@dataclass(frozen=True)
class Backoff:
    """How long to leave a node alone after consecutive failures: ``initial_s``,
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
        the doubling would pass it, however long the node stays away)."""
        try:
            grown = self.initial_s * self.factor ** (failures - 1)
        except OverflowError:  # a node down for hours: factor ** failures leaves float
            return float(self.max_s)
        return float(min(self.max_s, grown))


class Health:
    """Per node: consecutive failures and when it may be tried again (thread-safe)."""

    def __init__(self, backoff: Backoff, clock: Callable[[], float]) -> None:
        self.backoff, self._clock = backoff, clock
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def up(self, node: str) -> bool:
        """Whether ``node`` may be contacted now (no I/O)."""
        return self._clock() >= self._retry_at.get(node, float("-inf"))

    def ok(self, node: str) -> None:
        with self._lock:
            self._failures.pop(node, None)
            self._retry_at.pop(node, None)

    def fail(self, node: str) -> tuple[int, float]:
        """Count a failure of ``node``: its consecutive failures and its backoff (s)."""
        with self._lock:
            failures = self._failures[node] = self._failures.get(node, 0) + 1
            delay = self.backoff.delay(failures)
            self._retry_at[node] = self._clock() + delay
        return failures, delay

    @property
    def healthy(self) -> bool:
        """Whether no node's last call failed."""
        return not self._failures

    def check(self) -> None:
        if any(n < 1 for n in self._failures.values()):
            raise AssertionError(f"failure counts must be >= 1: {self._failures}")


class Nodes:
    """The tier's nodes: its link (built on first use by ``open_link``), each node's
    health, and ``call`` (module docstring); ``where`` names the tier in log lines."""

    def __init__(
        self, open_link: Callable[[], Link], backoff: Backoff, clock: Callable[[], float],
        stats: TierStats, where: str, timeout_s: float,
        hide: Callable[[str], str] = str,
    ) -> None:
        self._open, self.stats, self.where = open_link, stats, where
        self.timeout_s = timeout_s
        self.hide = hide
        """Makes text a server chose printable: the tier's secrets in it hidden."""
        self.health = Health(backoff, clock)
        self.last_error: str | None = None
        """Why the last failed call or refused reply failed (one line, no secret)."""
        self._link: Link | None = None
        self._lock = threading.Lock()  # guards building and closing the link

    def up(self, name: str) -> bool:
        """Whether the node holding ``name`` may be contacted now (no I/O)."""
        link = self._link
        if link is None:
            return self.health.up(CONNECT)
        return any(self.health.up(node) for node in link.route([name]))

    def call(self, names: Sequence[str], command: Command | Each) -> list[Reply]:
        """``command``'s reply for each of ``names``, ``UNREACHED`` where its node was not
        reached (module docstring)."""
        replies: list[Reply] = [UNREACHED] * len(names)
        with call_deadline(time.monotonic() + self.timeout_s):
            link = self._connect()
            if link is not None:
                groups = {(node, False): idx for node, idx in link.route(names).items()}
                self._send(link, groups, command, replies)
                redirects = self._redirects(link, replies)
                if redirects and remaining() > 0:  # else they stay refusals of their names
                    self._send(link, redirects, command, replies)
        return replies

    def _connect(self) -> Link | None:
        with self._lock:
            if self._link is None:
                if not self.health.up(CONNECT):
                    self.stats.add(skipped=1)
                    return None
                try:
                    self._link = self._open()
                except _faults() as e:
                    self._failed(CONNECT, e)
                    return None
                self.health.ok(CONNECT)
            return self._link

    def _send(
        self, link: Link, groups: dict[tuple[str, bool], list[int]], command: Command | Each,
        replies: list[Reply],
    ) -> None:
        """Every node that is up at once; replies land in place."""
        up: dict[tuple[str, bool], list[int]] = {}
        for (node, asking), indexes in groups.items():
            if self.health.up(node):
                up[(node, asking)] = indexes
            else:
                self.stats.add(skipped=1)
        failed = partial(self._node_failed, link)
        run = partial(run_within, link.run)  # the call's deadline goes with each job
        if isinstance(command, Each):
            faults = Faults(_faults(), redis_module().ResponseError)
            run_each(command, up, link.client, run, faults, self.timeout_s,
                     self.health.ok, failed, replies)
            return
        run([partial(self._one, link, node, asking, indexes, command, replies)
             for (node, asking), indexes in up.items()])

    def _one(
        self, link: Link, node: str, asking: bool, indexes: list[int], command: Command,
        replies: list[Reply],
    ) -> None:
        try:
            got = command(link.client(node), indexes, asking)
        except _faults() as e:
            self._node_failed(link, node, e)
            return
        self.health.ok(node)
        for i, reply in zip(indexes, got, strict=True):
            replies[i] = reply

    def _node_failed(self, link: Link, node: str, error: BaseException) -> None:
        self._failed(node, error)
        link.failed(node)

    def _redirects(self, link: Link, replies: list[Reply]) -> dict[tuple[str, bool], list[int]]:
        """(node, asking) -> indexes, for the replies that are ``MOVED`` or ``ASK``."""
        moved = redis_module().exceptions.MovedError  # a subclass of AskError
        groups: dict[tuple[str, bool], list[int]] = {}
        for i, reply in enumerate(replies):
            if isinstance(reply, Exception) and not isinstance(reply, Unreached):
                node = link.redirected(reply)
                if node is not None:
                    groups.setdefault((node, not isinstance(reply, moved)), []).append(i)
        return groups

    def _failed(self, node: str, error: BaseException) -> None:
        failures, delay = self.health.fail(node)
        at = {ServerLink.node: "", CONNECT: " (finding the cluster from its start-up nodes)"
              }.get(node, f" (node {node})")
        self.last_error = self.hide(describe(error) + at)
        self.stats.add(errors=1)
        if failures == 1:
            _log.warning("redis tier %s: %s; leaving it alone %.3g s", self.where,
                         self.last_error, delay)

    def close(self) -> None:
        with self._lock:
            link, self._link = self._link, None
        if link is not None:
            link.close()


def _faults() -> tuple[type[BaseException], ...]:
    """What a failed call raises: redis-py's errors, a cluster that cannot be found, socket
    errors, and a reply that cannot be read (``kvtier.tiers.redis.guard``)."""
    redis = redis_module()
    return redis.RedisError, redis.exceptions.RedisClusterException, OSError, UnusableReply


def describe(error: BaseException) -> str:
    """One line saying why a call failed: a refused login says so, apart from a server that
    does not answer."""
    redis = redis_module()
    if isinstance(error, redis.exceptions.RedisClusterException) and error.__cause__:
        error = error.__cause__  # the last start-up node's own failure says why
    if isinstance(error, redis.AuthenticationError) or (
            isinstance(error, redis.ResponseError) and "authenticat" in str(error)):
        return f"authentication failed (wrong or missing username or password): {error}"
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return f"the server does not answer ({error})"
    if isinstance(error, UnusableReply):
        return str(error)
    return f"the server refused the call ({error})"
