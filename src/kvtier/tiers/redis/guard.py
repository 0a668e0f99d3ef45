"""What keeps a Redis server, or anything between, from crashing or holding a call of the
tier: one deadline for the whole call that every socket operation honours, and a reply
redis-py cannot parse turned into the failure of its node.

A deadline, not a timeout per read: redis-py gives each socket read the full
``socket_timeout``, so a server that sends ``$4096\\r\\n`` and then one byte every 0.2 s keeps
a ``timeout_s=0.5`` call going for 800 s. Here the call sets its deadline
(``call_deadline``), every connection of the tier reads and writes through a
``BoundedSocket`` (installed when it connects: ``bound_connection``), and each ``recv`` or
``sendall`` waits for the time left at most; past the deadline it fails as a socket timeout
would. The deadline is a context variable, so the threads a call runs its nodes on get it
through ``run_within``.

redis-py's parser raises ``ValueError`` (``-MOVED garbage``), ``IndexError``,
``RecursionError`` (a reply nested 200,000 deep) and others on replies it cannot read;
``parsed`` turns exactly those, where replies are read, into ``UnusableReply``, which the
tier counts as its node's failure, like a server that does not answer.

>>> with call_deadline(float("-inf")):
...     remaining()
0.0
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

_DEADLINE: ContextVar[float] = ContextVar("kvtier_redis_call_deadline", default=math.inf)
"""When the current call must be over (``time.monotonic``); no bound outside a call."""

PARSE_ERRORS: tuple[type[Exception], ...] = (
    ValueError, IndexError, KeyError, TypeError, RecursionError, UnicodeError,
    OverflowError, AttributeError,
)
"""What redis-py raises on a reply it cannot parse, beside its own errors (seen: an
unpacking ``ValueError`` for ``-MOVED garbage``, ``int()``'s for ``!x``, a
``RecursionError`` for deep nesting; the others for replies of the wrong shape)."""


class UnusableReply(Exception):
    """A node sent a reply kvtier cannot use: the node has failed, its connection is closed."""

    @classmethod
    def of(cls, error: BaseException) -> UnusableReply:
        """The failure for what the parser raised (its text cut short: it may quote the
        reply, which a server chooses)."""
        return cls(f"the server sent a reply that cannot be read "
                   f"({type(error).__name__}: {str(error)[:80]})")


@contextmanager
def parsed() -> Iterator[None]:
    """Around code that reads replies: what the parser raises becomes ``UnusableReply``."""
    try:
        yield
    except PARSE_ERRORS as e:
        raise UnusableReply.of(e) from None


@contextmanager
def call_deadline(at: float) -> Iterator[None]:
    """Every socket operation of the tier inside must end by ``at`` (``time.monotonic``)."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def remaining() -> float:
    """Seconds left to the current call (infinite outside one; 0 once past)."""
    return max(0.0, _DEADLINE.get() - time.monotonic())


def run_within(
    run: Callable[[Sequence[Callable[[], None]]], None], jobs: Sequence[Callable[[], None]]
) -> None:
    """``run(jobs)``, each job under the current call's deadline, whichever thread runs it."""
    at = _DEADLINE.get()
    run([partial(_within, at, job) for job in jobs])


def _within(at: float, job: Callable[[], None]) -> None:
    with call_deadline(at):
        job()


class BoundedSocket:
    """A connected socket whose reads and writes wait no longer than the current call has
    left (nor than the socket's own timeout); everything else is the socket's."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._timeout: float | None = sock.gettimeout()

    def _arm(self) -> None:
        at = _DEADLINE.get()
        if at == math.inf:
            return
        left = at - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's deadline (timeout_s) has passed")
        self._sock.settimeout(left if self._timeout is None else min(left, self._timeout))

    def recv(self, *args: Any) -> bytes:
        self._arm()
        return bytes(self._sock.recv(*args))

    def recv_into(self, *args: Any) -> int:
        self._arm()
        return int(self._sock.recv_into(*args))

    def sendall(self, *args: Any) -> None:
        self._arm()
        self._sock.sendall(*args)

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout
        self._sock.settimeout(timeout)

    def gettimeout(self) -> float | None:
        return self._timeout

    def fileno(self) -> int:
        return int(self._sock.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def bound_connection(conn: Any) -> None:
    """redis-py's ``redis_connect_func``: the new connection's socket is bounded by the
    call's deadline from its first byte (login and handshake included), then the usual
    handshake runs (a reply to it that cannot be read closes the connection: redis-py
    closes it only for its own errors)."""
    conn._sock = BoundedSocket(conn._sock)
    try:
        with parsed():
            conn.on_connect()
    except UnusableReply:
        conn.disconnect()
        raise
