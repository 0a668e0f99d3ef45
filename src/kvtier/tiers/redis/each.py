"""The tier's small commands (``GET``, ``EXISTS``, ``DEL``: one name each) on every node of
a call from the calling thread, the replies read as they arrive.

A read's cost is the replies: megabytes per node, parsed by redis-py in Python. One thread
per node, as writes use (``Nodes``), makes those threads contend for the GIL while they
parse, and a cluster read then ran at 0.8 of a bare redis-py cluster pipeline, which reads
its nodes one after another from one thread. Here, as there, the requests (a few bytes per
name) go to every node first, and every node works on its share while the replies of the
first are read; unlike there, nodes that do not answer cost at most one ``timeout_s`` for
the whole call, however many of them stall:

1. take a connection of each node, in parallel where there are several (``Link.run``: a
   connection may have to be made, and a stalled node's handshake times out alone);
2. write each node's commands (``ASKING`` before each for an ``ASK`` redirection);
3. read whichever node's socket has data first, all of that node's replies, until every
   node has answered or the call's deadline (``timeout_s`` from its start,
   ``kvtier.tiers.redis.guard``) has passed; a node still silent then has failed, as has
   one whose connection breaks, that trickles past the deadline, or whose reply cannot be
   read.

A failed node's connection is closed, so no reply left unread is ever taken for another
command's; a reply refused for one name (``WRONGTYPE``, ``MOVED``, ``ASK``) stays in place.
"""

from __future__ import annotations

import functools
import inspect
import selectors
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kvtier.tiers.redis.guard import parsed, remaining


@dataclass(frozen=True)
class Landed:
    """A value a reader put where it was asked to (``kvtier.tiers.redis.into``), not into
    a bytes object: its first ``len(head)`` bytes, then ``body`` bytes in the view given for
    its name; ``fits`` False for a value too long for that view (read past, kept nowhere)."""

    head: bytes
    body: int
    fits: bool = True


Reply = bytes | int | str | None | Exception | Landed
"""One command's reply for one name: a value, None (no such key), or an error."""

Failed = Callable[[str, BaseException], None]
"""What to do with a node that failed (count it, back off, refresh the slot map)."""


@dataclass(frozen=True)
class Each:
    """``command <name>`` for each of ``names`` a call gives a node (by index)."""

    command: str
    names: Sequence[str]

    def pack(self, conn: Any, indexes: Sequence[int], asking: bool) -> list[bytes]:
        """The wire bytes of the commands for ``indexes`` (``ASKING`` before each if
        ``asking``)."""
        ask: list[tuple[str, ...]] = [("ASKING",)] if asking else []
        commands = [c for i in indexes for c in (*ask, (self.command, self.names[i]))]
        return list(conn.pack_commands(commands))

    def read_all(self, conn: Any, indexes: Sequence[int], refused: type[Exception],
                 asking: bool) -> list[Reply]:
        """The replies on ``conn`` of the commands for ``indexes``, in order
        (``next_reply``)."""
        return [next_reply(conn, refused, asking) for _ in indexes]


@dataclass
class _Share:
    """One node's part of a call: its indexes, its connection, and its replies so far."""

    node: str
    asking: bool
    indexes: list[int]
    client: Any = None
    """The node's redis-py client, held for the call: a client collected mid-call (a slot
    map refresh replaced it) closes its pool, the connections in use included."""
    pool: Any = None
    conn: Any = None
    got: list[Reply] = field(default_factory=list)


@dataclass(frozen=True)
class Faults:
    """What a failed node raises (``node``), and what a reply refused for one name raises
    (``reply``, a subclass of some of ``node``: caught first)."""

    node: tuple[type[BaseException], ...]
    reply: type[Exception]


def run_each(
    each: Each, groups: dict[tuple[str, bool], list[int]], client: Callable[[str], Any],
    run: Callable[[Sequence[Callable[[], None]]], None], faults: Faults, timeout_s: float,
    ok: Callable[[str], None], failed: Failed, replies: list[Reply],
) -> None:
    """Send ``each`` to every (node, asking) of ``groups`` and put each node's replies in
    ``replies`` (module docstring). ``client(node)`` is a node's redis-py client, ``run``
    runs jobs in parallel; ``ok`` and ``failed`` are told each node's outcome."""
    shares = [_Share(node, asking, indexes) for (node, asking), indexes in groups.items()]
    run([partial(_connect, share, client, faults, failed) for share in shares])
    sent = []
    for share in shares:
        if share.conn is None:
            continue
        try:
            share.conn.send_packed_command(each.pack(share.conn, share.indexes, share.asking))
        except faults.node as e:
            _close(share, failed, e)
            continue
        sent.append(share)
    _receive(sent, each, faults, timeout_s, failed)
    for share in sent:
        if share.conn is not None:
            share.pool.release(share.conn)
            ok(share.node)
            for i, reply in zip(share.indexes, share.got, strict=True):
                replies[i] = reply


def _connect(
    share: _Share, client: Callable[[str], Any], faults: Faults, failed: Failed
) -> None:
    try:
        share.client = client(share.node)
        share.pool = share.client.connection_pool
        share.conn = checkout(share.pool)
    except faults.node as e:
        failed(share.node, e)


def _receive(
    shares: list[_Share], each: Each, faults: Faults, timeout_s: float, failed: Failed
) -> None:
    """Read every share's replies as its socket becomes readable, until the call's deadline
    (``timeout_s``: for the message) at most; one node's replies, once started, are read to
    the end or to the deadline, whichever comes first."""
    deadline = time.monotonic() + min(timeout_s, remaining())
    waiting: dict[int, _Share] = {}
    with selectors.DefaultSelector() as sel:
        for share in shares:
            sock = getattr(share.conn, "_sock", None)  # redis-py's socket, once connected
            if sock is None:  # not a socket this redis-py exposes: read it in turn
                _read_all(share, each, faults, failed)
            else:
                sel.register(sock, selectors.EVENT_READ, share)
                waiting[id(share)] = share
        while waiting:
            ready = sel.select(max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for selected, _ in ready:
                sel.unregister(selected.fileobj)
                _read_all(selected.data, each, faults, failed)
                waiting.pop(id(selected.data))
    for share in waiting.values():
        _close(share, failed, TimeoutError(f"no reply within timeout_s ({timeout_s:g} s)"))


def _read_all(share: _Share, each: Each, faults: Faults, failed: Failed) -> None:
    """All of ``share``'s replies (an ``ASKING`` reply before each, dropped)."""
    try:
        share.got.extend(each.read_all(share.conn, share.indexes, faults.reply, share.asking))
    except faults.node as e:
        _close(share, failed, e)


def next_reply(conn: Any, refused: type[Exception], asking: bool = False) -> Reply:
    """The next command's reply on ``conn`` (after its ``ASKING``'s, if ``asking``); a
    reply ``refused`` for its name (``ResponseError``) is returned in its place; one that
    cannot be read raises ``UnusableReply`` (the caller closes the connection)."""
    try:
        with parsed():
            if asking:
                conn.read_response()
            return conn.read_response()
    except refused as e:
        return e


def _close(share: _Share, failed: Failed, error: BaseException) -> None:
    """A failed node: its connection closed (nothing unread survives), then reported."""
    if share.conn is not None:
        share.conn.disconnect()
        share.pool.release(share.conn)
        share.conn = None
    failed(share.node, error)


def checkout(pool: Any) -> Any:
    """A connection of ``pool``, handed back with ``pool.release`` (connected and logged in:
    a login reply that cannot be read raises ``UnusableReply``)."""
    with parsed():
        if _wants_a_command_name(type(pool).get_connection):  # redis-py before 5.3
            return pool.get_connection("SET")
        return pool.get_connection()


@functools.cache
def _wants_a_command_name(get_connection: Callable[..., Any]) -> bool:
    """Whether a pool's ``get_connection`` takes a command name it cannot do without."""
    _, *parameters = inspect.signature(get_connection).parameters.values()
    return bool(parameters) and parameters[0].default is inspect.Parameter.empty and (
        parameters[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                               inspect.Parameter.POSITIONAL_OR_KEYWORD))
