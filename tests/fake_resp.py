"""A fake Redis server for the hostile-server tests: a thread on 127.0.0.1 that answers like
a tiny Redis (GET, SET, EXISTS, DEL, the client's handshake, and, as a one-node cluster,
CLUSTER SLOTS), or, while ``hostile`` is set, answers the commands it names with malformed
replies, trickles, huge announced lengths, resets or silence.

Bounded: every connection's thread ends when the client goes, when the server stops, or
after its trickle; waits are ``Event.wait`` on the stop event, never a bare sleep. Use it as
a context manager.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
from dataclasses import dataclass
from typing import BinaryIO, Literal

from redis.crc import key_slot

DATA = frozenset({"GET", "SET", "EXISTS", "DEL"})
HANDSHAKE = frozenset({"CLIENT", "HELLO", "AUTH", "SELECT"})
SLOTS = frozenset({"CLUSTER"})

Then = Literal["answer", "hang", "close", "reset"]


@dataclass(frozen=True)
class Hostile:
    """Instead of answering a command of ``on``: send ``reply`` (``{port}``, ``{slot}`` and
    ``{args}`` stand for the server's port, the command's key's slot and its arguments, a
    password among them), then ``trickle`` one byte
    every ``every_s``, then: ``answer`` (read the next command), ``hang`` (hold the
    connection, silent), ``close`` or ``reset`` (RST) it."""

    reply: bytes
    on: frozenset[str] = DATA
    trickle: bytes = b""
    every_s: float = 0.05
    then: Then = "answer"


class FakeRedis:
    """The server (module docstring); ``cluster``: answer CLUSTER SLOTS as a one-node
    cluster holding every slot."""

    def __init__(self, cluster: bool = False) -> None:
        self.cluster = cluster
        self.hostile: Hostile | None = None
        self.data: dict[bytes, bytes] = {}
        self.stop = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def node(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FakeRedis:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def answer(self, command: list[bytes], resp3: bool) -> bytes:
        """What a well Redis would answer (for what the tier and redis-py send; ``resp3``:
        the client said ``HELLO 3``, as redis-py >= 8 does)."""
        name = command[0].upper()
        args = command[1:]
        if name == b"GET":
            value = self.data.get(args[0])
            if value is None:
                return b"_\r\n" if resp3 else b"$-1\r\n"
            return bulk(value)
        if name == b"SET":
            self.data[args[0]] = args[1]
            return b"+OK\r\n"
        if name in (b"EXISTS", b"DEL"):
            found = [a for a in args if a in self.data]
            if name == b"DEL":
                for a in found:
                    del self.data[a]
            return b":%d\r\n" % len(found)
        if name == b"CLUSTER" and self.cluster:
            node = b"*2\r\n" + bulk(b"127.0.0.1") + b":%d\r\n" % self.port
            return b"*1\r\n*3\r\n:0\r\n:16383\r\n" + node
        if name == b"HELLO":
            fields = [bulk(b"server"), bulk(b"redis"), bulk(b"version"), bulk(b"7.2.0"),
                      bulk(b"proto"), b":3\r\n"]
            return b"%3\r\n" + b"".join(fields)
        if name in (b"CLIENT", b"ASKING", b"SELECT", b"AUTH"):
            return b"+OK\r\n"
        if name == b"PING":
            return b"+PONG\r\n"
        return b"-ERR unknown command\r\n"


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: FakeRedis


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        fake = self.server.fake
        resp3 = False
        while not fake.stop.is_set():
            command = read_command(self.rfile)
            if command is None:
                return
            resp3 = resp3 or command[:2] == [b"HELLO", b"3"]
            hostile = fake.hostile
            if hostile is None or command[0].upper().decode(errors="replace") not in hostile.on:
                self.wfile.write(fake.answer(command, resp3))
                continue
            if not self._misbehave(fake, hostile, command):
                return

    def _misbehave(self, fake: FakeRedis, hostile: Hostile, command: list[bytes]) -> bool:
        """Answer ``command`` as ``hostile`` says; whether to go on reading commands."""
        slot = key_slot(command[1]) if len(command) > 1 else 0
        reply = hostile.reply.replace(b"{port}", b"%d" % fake.port)
        reply = reply.replace(b"{args}", b" ".join(command[1:])[:200])
        try:
            self.wfile.write(reply.replace(b"{slot}", b"%d" % slot))
            for byte in hostile.trickle:
                if fake.stop.wait(hostile.every_s):
                    return False
                self.wfile.write(bytes([byte]))
        except OSError:  # the client gave up: this connection is over
            return False
        if hostile.then == "hang":
            while not fake.stop.wait(0.05) and self._open():
                pass
        elif hostile.then == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
        return hostile.then == "answer"

    def _open(self) -> bool:
        """Whether the client still holds the connection (it has not closed its end)."""
        self.connection.setblocking(False)
        try:
            return self.connection.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            self.connection.setblocking(True)


def read_command(rfile: BinaryIO) -> list[bytes] | None:
    """One command the client sent (an array of bulk strings), None once it has gone."""
    try:
        head = rfile.readline()
        if not head.startswith(b"*"):
            return None
        command = []
        for _ in range(int(head[1:])):
            size = int(rfile.readline()[1:])
            command.append(rfile.read(size + 2)[:-2])
        return command
    except (OSError, ValueError):
        return None
