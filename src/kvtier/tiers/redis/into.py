"""A promotion's ``GET``s, each value read off the socket straight into its host slot.

redis-py hands a value over as a new bytes object (hiredis, or its own parser, copies it out
of its read buffer), which a promotion then copies again into the slot it fills: two copies
and an allocation of a megabyte per chunk, most of a promotion's time from a local server.
``GetInto`` reads the replies of its ``GET``s itself, from the connection's socket: the
reply's length line and the record's header into a small buffer, the rest of the value with
``recv_into`` into the view given for its name, then the closing ``\\r\\n``.

The ``GET``s are paced, not all written at once: a server builds the reply of every command
it has read before it writes the first (Redis copies each value into its reply buffers), so a
promotion of fifteen megabytes asked for at once waits for fifteen megabytes to be copied,
into memory fresh from the server's allocator, before its first byte arrives. ``GetInto``
writes ``GET``s for about ``AHEAD_BYTES`` of values, then, as each reply starts to arrive,
enough more to keep that much asked for ahead of it: the server copies the next value while
the last one is on the wire, into memory the one before freed.

Why nothing else can be on the socket: a connection comes from its pool only with nothing to
read (redis-py checks ``can_read`` when it hands one out), the commands are this call's, and
their replies are read to their last byte, so the pool gets the connection back as it would
from redis-py's own parser. Bytes past the last reply, a length line that does not parse,
or a reply of a kind ``GET`` never gets (an array, a map, a push: RESP3) fail the node like
any reply that cannot be read (``UnusableReply``: its connection is closed, nothing unread
survives). Errors (``WRONGTYPE``, ``MOVED``, ``ASK``) are parsed as redis-py parses them, so
redirections are followed as for ``get``; an integer or a status is handed back as such (the
tier refuses it for its name). Every ``recv`` is bounded by the call's deadline
(``guard.BoundedSocket``), and a value longer than its view is read past in pieces, never
held: a server announcing a huge length costs at most the call's ``timeout_s``.
"""

from __future__ import annotations

import functools
import importlib
import math
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.tiers.records.format import HEADER_BYTES
from kvtier.tiers.redis.each import Each, Landed, Reply
from kvtier.tiers.redis.guard import UnusableReply, parsed, remaining
from kvtier.tiers.redis.links import redis_module

try:  # the compiled build's reader (setup.py, NATIVE): the GIL released for a node's replies
    from kvtier._native import recv_values as _recv_values
except ImportError:  # the pure build
    _recv_values = None  # type: ignore[assignment]

LINE_BYTES = 8192
"""Bytes asked of the socket for a reply's line: the line, the record's header and the
value's first few KiB; the rest goes straight into the slot."""
MAX_LINE = 64 * 1024
"""The longest reply line taken (a Redis error or length line is tens of bytes)."""
AHEAD_BYTES = 1 << 20
"""Bytes of values a promotion keeps asked for ahead of the reply it is reading (at least
one ``GET``; topped up when less than half is left). Measured from a local server, 15 values
of a megabyte: 6.9 ms paced a megabyte ahead, 9.5 ms asked for at once, and inside vLLM's
CPU engine 12 ms against 19. A megabyte is more than a datacenter link carries in a round
trip, so a remote server is not left idle between two values."""
MAX_VALUE = 512 << 20
"""The longest value a Redis server stores (``proto-max-bulk-len``'s default); a longer
announced length is no reply of a server."""


@dataclass(frozen=True)
class GetInto(Each):
    """``GET <name>`` for each of ``names``, the value of ``names[i]`` read into ``views[i]``
    (module docstring). The replies are ``Landed`` (or None, an error, an integer, a status;
    ``bytes`` only where the connection exposes no socket and redis-py's parser read it)."""

    views: Sequence[memoryview] = ()

    def pack(self, conn: Any, indexes: Sequence[int], asking: bool) -> list[bytes]:
        if asking or getattr(conn, "_sock", None) is None:  # all at once (``ASK`` is rare)
            return super().pack(conn, indexes, asking)
        return [self._paced(conn, indexes)[0]]

    def read_all(self, conn: Any, indexes: Sequence[int], refused: type[Exception],
                 asking: bool) -> list[Reply]:
        sock = getattr(conn, "_sock", None)
        if sock is None:
            return super().read_all(conn, indexes, refused, asking)
        wire = _Wire(sock)
        sends = [b""] * len(indexes) if asking else self._paced(conn, indexes)[1]
        with parsed():
            got = [] if asking else wire.values([self.views[i] for i in indexes], sends)
            for n, i in enumerate(indexes[len(got):], start=len(got)):
                first = wire.reply(None) if asking else None
                reply = wire.reply(self.views[i], sends[n])
                got.append(first if isinstance(first, Exception) else reply)
        if wire.left:
            raise UnusableReply(f"the server sent {wire.left} bytes past its replies")
        return got

    def _paced(self, conn: Any, indexes: Sequence[int]) -> tuple[bytes, list[bytes]]:
        """The ``GET``s for ``indexes`` as ``pack`` writes them first, and for each reply
        those written once its line is read (module docstring; each view's size stands
        for its value's)."""
        gets = [b"".join(conn.pack_command("GET", self.names[i])) for i in indexes]
        sizes = [self.views[i].nbytes for i in indexes]
        if not gets:
            return b"", []
        sent, ahead = 1, sizes[0]
        while sent < len(gets) and ahead + sizes[sent] <= AHEAD_BYTES:
            ahead, sent = ahead + sizes[sent], sent + 1
        first, sends = b"".join(gets[:sent]), []
        for n in range(len(gets)):
            ahead -= sizes[n]  # reply n arriving: what is asked for past it
            start = sent
            if sent == n + 1 or 2 * ahead < AHEAD_BYTES:
                while sent < len(gets) and (sent == n + 1 or ahead + sizes[sent] <= AHEAD_BYTES):
                    ahead, sent = ahead + sizes[sent], sent + 1
            sends.append(b"".join(gets[start:sent]))
        return first, sends


class _Wire:
    """One connection's socket, read reply by reply; ``buf[pos:]`` is read and not yet used."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        raw = getattr(sock, "_sock", sock)  # a ``BoundedSocket``'s own
        self.raw: socket.socket | None = raw if type(raw) is socket.socket else None
        """A plain TCP or Unix socket, which ``_native.recv_values`` reads (not TLS)."""
        self.buf = bytearray()
        self.pos = 0

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def values(self, views: list[memoryview], sends: list[bytes]) -> list[Reply]:
        """As many replies as the compiled build's reader takes in one call, the GIL
        released throughout (``_native.recv_values``: values that fit their views, missing
        keys; ``sends[i]`` written once reply ``i`` starts); none in the pure build. What it
        stops at is left for ``reply``."""
        if _recv_values is None or self.raw is None:
            return []
        left = min(remaining(), self.raw.gettimeout() or math.inf)
        if left <= 0:
            raise TimeoutError("the call's deadline (timeout_s) has passed")
        heads, bodies, rest = _recv_values(self.raw.fileno(), min(left, 3600.0),
                                           bytes(self.buf[self.pos :]), views, HEADER_BYTES,
                                           sends)
        self.buf, self.pos = bytearray(rest), 0
        return [None if h is None else Landed(h, n) for h, n in zip(heads, bodies, strict=True)]

    def reply(self, view: memoryview | None, then: bytes = b"") -> Reply:
        """The next reply; a value goes into ``view`` (None: read past, an ``ASKING``'s).
        ``then`` is written once the reply's line is read."""
        line = self._line()
        if then:
            self.sock.sendall(then)
        kind, rest = line[:1], line[1:]
        if kind == b"$":
            n = _number(rest)
            if n == -1:
                return None
            if not 0 <= n <= MAX_VALUE:
                raise UnusableReply(f"the server announced a value of {n} bytes")
            if view is None or n > HEADER_BYTES + view.nbytes:
                self._skip(n)
                self._end()
                return Landed(b"", n, fits=False)
            head = self._take(min(n, HEADER_BYTES))
            self._into(view[: n - len(head)])
            self._end()
            return Landed(head, n - len(head))
        if kind == b"-":
            return _error(rest.decode("utf-8", "replace"))
        if kind == b"_" and not rest:  # RESP3's null
            return None
        if kind == b":":
            return _number(rest)
        if kind == b"+":
            return rest.decode("utf-8", "replace")
        raise UnusableReply(f"the server answered GET with a reply of type {kind!r}")

    def _fill(self) -> None:
        chunk = self.sock.recv(LINE_BYTES)
        if not chunk:
            raise ConnectionError("the server closed the connection mid-reply")
        if self.pos:
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += chunk

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n", self.pos)) < 0:
            if self.left > MAX_LINE:
                raise UnusableReply(f"the server sent a reply line over {MAX_LINE} bytes")
            self._fill()
        line = bytes(self.buf[self.pos : end])
        self.pos = end + 2
        return line

    def _take(self, n: int) -> bytes:
        while self.left < n:
            self._fill()
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def _into(self, view: memoryview) -> None:
        """Fill ``view`` whole: first from what was read, then from the socket."""
        have = min(self.left, view.nbytes)
        view[:have] = self.buf[self.pos : self.pos + have]
        self.pos += have
        while have < view.nbytes:
            got = self.sock.recv_into(view[have:])
            if not got:
                raise ConnectionError("the server closed the connection mid-value")
            have += got

    def _skip(self, n: int) -> None:
        """Read past ``n`` bytes of a value, a piece at a time."""
        have = min(self.left, n)
        self.pos += have
        n -= have
        if n:
            scratch = memoryview(bytearray(min(n, 1 << 20)))
            while n:
                got = self.sock.recv_into(scratch[: min(n, scratch.nbytes)])
                if not got:
                    raise ConnectionError("the server closed the connection mid-value")
                n -= got

    def _end(self) -> None:
        if self._take(2) != b"\r\n":
            raise UnusableReply("the server's value does not end where its length says")


def _number(text: bytes) -> int:
    """A reply line's integer (digits, a leading ``-``); anything else fails the node."""
    digits = text[1:] if text.startswith(b"-") else text
    if not digits.isdigit() or len(digits) > 20:
        raise UnusableReply(f"the server sent {text[:24]!r} where a number belongs")
    return int(text)


@functools.cache
def _parse_error() -> Any:
    """redis-py's own reading of an error line (``MOVED``, ``ASK`` and the rest as its
    exception classes), so that redirections are followed exactly as for ``get``."""
    redis_module()  # imported as the tier imports it (a missing extra says what to install)
    return importlib.import_module("redis._parsers.base").BaseParser.parse_error


def _error(text: str) -> Exception:
    error: Exception = _parse_error()(text)
    return error
