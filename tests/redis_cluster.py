"""A real Redis Cluster for the tests: ``redis-server --cluster-enabled yes`` processes on
free loopback ports, joined with ``redis-cli --cluster create``, stopped at the end.

Every node runs with ``cluster-require-full-coverage no``: when one master is down the
others keep serving their own slots (what a fleet should configure, docs/tiers.md), so a
test can check that a dead node costs misses for its slots only. Faults: ``kill`` a node,
``pause`` it (SIGSTOP: it accepts connections but never answers), ``resume`` it, and
``restart`` a killed one on the same port and cluster config file, so it takes its slots
back. Waiting is by polling ``CLUSTER INFO`` (bounded), never a fixed sleep.

>>> with LocalRedisCluster(tmp_path) as cluster:        # doctest: +SKIP
...     cluster.startup_nodes                            # ['127.0.0.1:P1', ...]
...     cluster.kill(cluster.master_of(b"kvtier:ab12"))
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
HAVE_CLUSTER_TOOLS = REDIS_SERVER is not None and REDIS_CLI is not None
"""Whether this machine can start a cluster (Debian's redis-server package ships both)."""

_BUS_OFFSET = 10000  # a node's cluster bus listens on its port + 10000


def poll(condition: Callable[[], bool], timeout_s: float, step_s: float = 0.02) -> bool:
    """Whether ``condition()`` became true within ``timeout_s`` (a bounded poll of a real
    process or server, every ``step_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step_s)
    return condition()


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port(taken: Sequence[int] = ()) -> int:
    """A loopback port that is free, as is its cluster bus port (port + 10000)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if (port + _BUS_OFFSET < 65536 and port not in taken
                and port + _BUS_OFFSET not in taken and _free(port + _BUS_OFFSET)):
            return port
    raise RuntimeError("no free port pair (port, port + 10000) on loopback")


class ClusterNode:
    """One ``redis-server`` of the cluster: its port, its own directory (which holds its
    cluster config file), and its process while it runs."""

    def __init__(self, workdir: Path, port: int, password: str | None, args: Sequence[str]):
        self.port, self.password = port, password
        self.dir = workdir / f"node-{port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        secret = ["--requirepass", self.password, "--masterauth", self.password] \
            if self.password else []
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{self.port}.conf",
             "--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
             "--save", "", "--appendonly", "no", "--dir", str(self.dir), *secret, *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.paused = False
        if not poll(lambda: self.query("PING") is not None, timeout_s=10.0):
            raise RuntimeError(f"redis-server did not answer PING on port {self.port}")

    @property
    def running(self) -> bool:
        return self.proc is not None

    def query(self, *command: str | bytes | int) -> Any:
        """The node's reply to ``command``, or None if it does not answer (0.5 s)."""
        import redis

        try:
            with redis.Redis(port=self.port, password=self.password, socket_timeout=0.5,
                             socket_connect_timeout=0.5) as client:
                return client.execute_command(*command)
        except redis.RedisError:
            return None

    def state_ok(self) -> bool:
        info = self.query("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info or "")
        return "cluster_state:ok" in text

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None, f"node {self.port} is not running"
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # SIGKILL ends a stopped (paused) process too
            self.proc.wait(timeout=10)
            self.proc, self.paused = None, False


class LocalRedisCluster:
    """``masters`` masters (at least 3) with ``replicas`` replicas each, on loopback;
    ``password`` makes every node require it. Use as a context manager, or call ``start``
    and ``stop`` (``stop`` is safe to call twice and after a failed ``start``)."""

    def __init__(
        self, workdir: Path, masters: int = 3, replicas: int = 0,
        password: str | None = None, args: Sequence[str] = (),
    ) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 masters")
        ports: list[int] = []
        for _ in range(masters * (1 + replicas)):
            ports.append(free_cluster_port(ports))
        self.password, self.replicas = password, replicas
        self.nodes = [ClusterNode(Path(workdir), p, password, args) for p in ports]

    # ---- life ------------------------------------------------------------------------

    def start(self) -> LocalRedisCluster:
        assert REDIS_CLI is not None, "redis-cli is not on PATH"
        try:
            for node in self.nodes:
                node.start()
            auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
            subprocess.run(
                [REDIS_CLI, *auth, "--cluster", "create", *self.startup_nodes,
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
            )
            self.wait_ok()
            self.wait_replicated()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every node (paused ones too)."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalRedisCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        """Poll until every running, unpaused node says ``cluster_state:ok`` and agrees on
        who serves every slot that a running node serves."""
        live = [n for n in self.nodes if n.running and not n.paused]
        if not poll(lambda: all(n.state_ok() for n in live) and self._agreed(live),
                     timeout_s):
            raise RuntimeError(f"cluster not ok after {timeout_s} s")

    def wait_replicated(self, timeout_s: float = 30.0) -> None:
        """Poll until every replica of a running master is online and has every write the
        master has (so that a failover loses nothing); no-op without replicas."""
        def synced(node: ClusterNode) -> bool:
            info = node.query("INFO", "replication")
            if not isinstance(info, dict) or info.get("role") != "master":
                return True
            replicas = [v for k, v in info.items() if k.startswith("slave")
                        and isinstance(v, dict)]
            return all(r.get("state") == "online" and r.get("offset") ==
                       info.get("master_repl_offset") for r in replicas)

        live = [n for n in self.nodes if n.running and not n.paused]
        if not poll(lambda: all(synced(n) for n in live), timeout_s):
            raise RuntimeError(f"replicas not in sync after {timeout_s} s")

    def wait_failover(self, index: int, timeout_s: float = 30.0) -> None:
        """Poll until no slot is served by killed master ``index`` any more (one of its
        replicas took over) and the cluster is ok."""
        port = self.nodes[index].port
        if not poll(lambda: port not in (self._owners(self._any_live()) or {port: port})
                     .values(), timeout_s):
            raise RuntimeError(f"no replica took over from node {port} in {timeout_s} s")
        self.wait_ok(timeout_s)

    def _agreed(self, live: Sequence[ClusterNode]) -> bool:
        views = [self._owners(n) for n in live]
        return all(v is not None and v == views[0] for v in views)

    # ---- topology --------------------------------------------------------------------

    @property
    def startup_nodes(self) -> list[str]:
        """``host:port`` of every node, as a client's start-up nodes."""
        return [n.address for n in self.nodes]

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def _owners(self, via: ClusterNode) -> dict[int, int] | None:
        """Slot -> port of the master serving it, as ``via`` sees it."""
        slots = via.query("CLUSTER", "SLOTS")
        if slots is None:
            return None
        owners: dict[int, int] = {}
        for start, end, master, *_ in slots:
            for slot in range(int(start), int(end) + 1):
                owners[slot] = int(master[1])
        return owners

    def _any_live(self) -> ClusterNode:
        for node in self.nodes:
            if node.running and not node.paused:
                return node
        raise RuntimeError("no node of the cluster is running")

    @staticmethod
    def slot_of(key: str | bytes) -> int:
        """The hash slot of ``key`` (CRC16 of its hash tag, as the cluster computes it)."""
        from redis.crc import key_slot

        return int(key_slot(key.encode() if isinstance(key, str) else key))

    def master_of(self, key: str | bytes) -> int:
        """Index in ``nodes`` of the master serving ``key``."""
        owners = self._owners(self._any_live())
        assert owners is not None
        return self.ports.index(owners[self.slot_of(key)])

    def masters(self) -> list[int]:
        """Indexes of the nodes that serve slots now."""
        owners = self._owners(self._any_live())
        assert owners is not None
        return sorted({self.ports.index(p) for p in owners.values()})

    # ---- faults ----------------------------------------------------------------------

    def kill(self, index: int) -> None:
        """SIGKILL node ``index``; its cluster config file stays for ``restart``."""
        self.nodes[index].stop()

    def pause(self, index: int) -> None:
        """SIGSTOP node ``index``: connections open, nothing is answered."""
        self.nodes[index].signal(signal.SIGSTOP)
        self.nodes[index].paused = True

    def resume(self, index: int) -> None:
        """SIGCONT a paused node."""
        self.nodes[index].signal(signal.SIGCONT)
        self.nodes[index].paused = False

    def restart(self, index: int, timeout_s: float = 30.0) -> None:
        """Start killed node ``index`` again on its port and config file (it takes its
        slots back, empty), and wait until the cluster is ok with it."""
        node = self.nodes[index]
        assert not node.running, f"node {node.port} still runs: kill it first"
        node.start()
        self.wait_ok(timeout_s)

    def move_slot(self, slot: int, to: int, finish: bool = True) -> None:
        """Migrate ``slot`` with its keys to node ``to`` (a master), the way
        ``redis-cli --cluster reshard`` does: IMPORTING, MIGRATING, MIGRATE, then NODE (the
        old owner then answers MOVED). ``finish=False`` stops before NODE: the slot stays
        migrating, and the old owner answers ASK for its keys."""
        dst = self.nodes[to]
        owners = self._owners(dst)
        assert owners is not None, f"node {dst.port} does not answer"
        src = self.nodes[self.ports.index(owners[slot])]
        dst_id, src_id = dst.query("CLUSTER", "MYID"), src.query("CLUSTER", "MYID")
        assert dst.query("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        assert src.query("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        auth = ["AUTH", self.password] if self.password else []
        while keys := src.query("CLUSTER", "GETKEYSINSLOT", slot, 100):
            assert src.query("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, *auth,
                             "KEYS", *keys) is not None
        if finish:
            self.finish_move(slot, to)

    def finish_move(self, slot: int, to: int) -> None:
        """End a migration that ``move_slot(finish=False)`` began: ``slot`` is ``to``'s."""
        dst_id = self.nodes[to].query("CLUSTER", "MYID")
        for node in self.nodes:
            if node.running and not node.paused:
                node.query("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        self.wait_ok()
