"""``kvtier replay --bytes``: the replay over a real ``TieredStore``, moving real bytes.

The metadata replay (``metadata.MetadataTiers``) knows where each chunk is; this one also
moves and checks its bytes through kvtier's real tiers: a ``HostSlab`` of real slots under
the host ``ChunkStore``, a ``DiskTier`` of checksummed files in a directory, a
``RedisTier`` on a server. The planner and the driver (``sim.Driver``) are the same.

* **Scaled slots.** Capacities are counted in the layout's real chunk bytes (``slots =
  capacity // real chunk bytes``, as without ``--bytes``), but each slot holds only
  ``slot_bytes`` bytes (default 4 KiB), so a replay of 64 GiB of host memory fits a laptop.
  Reports give bytes both as the real layout's (chunks times real chunk bytes) and as
  actually moved.
* **The data plane** (``PayloadPlane``): a store job fills each chunk's host slot with
  ``payload(key)`` (the key repeated), and a load job reads each slot back and compares it
  byte for byte: ``verified_chunks`` and ``corrupt_chunks`` (any is a kvtier bug; the hit
  is then rolled back).
* **Promotions** go through the real path: ``TieredStore.lookup`` reports a chunk found
  below as WRITING and fetches it on the tier's workers; the planner answers WAIT; the
  plane's ``settle`` waits for the background work (``TieredStore.flush``) and the driver
  asks again. The planner and the store share a virtual clock that advances one second per
  request and never during one, so waits never time out by accident and a chunk found
  nowhere is remembered as absent within its request only (``MISS_TTL_S``). Between
  requests all background work is complete (``BytesTiers.locate`` flushes), so a replay
  is deterministic while the disk does not evict (its workers may publish concurrent
  write-backs in either order, which its LRU then sees).

Where the real store differs from the model: a promoted chunk stays on disk too (the
model moves it up: exclusive tiers), a promotion may evict the request's other host
chunks (they are then promoted in a further WAIT round), and lower tiers keep recency
only through reads (the model refreshes a disk chunk a request references). With a disk
that never evicts, both hold every chunk ever stored, so block and token hit rates are
equal (tested).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.keys import ChunkKey
from kvtier.layout import Layout
from kvtier.planner import TransferJob
from kvtier.replay.driver import Driver, Workload
from kvtier.replay.metadata import DISK, HOST, REDIS
from kvtier.replay.policies import INFINITE, build_policy
from kvtier.replay.stats import ReplayStats
from kvtier.store import ChunkState, ChunkStore, LoadHandle, Policy, StoreHandle, StoreRefusal
from kvtier.store.disk import DiskTier
from kvtier.store.host import HostSlab
from kvtier.store.lower import LowerTier
from kvtier.store.manager import checked_keys
from kvtier.store.record import HEADER_BYTES, geometry_of
from kvtier.store.remote import RedisTier
from kvtier.store.results import Subscriber
from kvtier.store.tiered import TieredStore

REQUEST_S = 1.0
"""Virtual seconds between two requests."""
MISS_TTL_S = 0.5
"""How long a chunk found in no tier stays absent: less than a request's time."""
GIVE_UP_S = 0.25
"""After ``MAX_WAIT_ROUNDS`` WAITs the clock jumps this far, past the planner's wait
deadline (0.05 s), so it takes the hit that is ready."""
MAX_WAIT_ROUNDS = 16
REDIS_TTL_S = 3600
"""The replay's chunks on a Redis server expire after an hour (a namespace per run)."""


@dataclass(frozen=True)
class BytesOptions:
    """How ``--bytes`` builds its tiers."""

    slot_bytes: int = 4096
    """Bytes each slot really holds (capacities still count the layout's real chunks)."""
    disk_dir: str | None = None
    """Where the disk tier's files go, one subdirectory per policy; None: a temporary
    directory, removed at the end."""
    redis_url: str | None = None
    """A Redis server below the disk (or below host memory), or None."""
    fsync: bool = False
    """fsync every disk chunk (durability, which a capacity replay does not need)."""

    def __post_init__(self) -> None:
        if isinstance(self.slot_bytes, bool) or not isinstance(self.slot_bytes, int) or (
                self.slot_bytes < 1):
            raise ValueError(f"--slot-bytes must be a positive integer, got {self.slot_bytes!r}")


class VirtualClock:
    """Seconds that pass only when the replay says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def payload(key: ChunkKey, nbytes: int) -> bytes:
    """The bytes the replay stores for ``key``: the key repeated, cut to ``nbytes``.

    >>> payload(ChunkKey(bytes(range(40))), 43)[-4:]
    b"'\\x00\\x01\\x02"
    """
    return (bytes(key) * (nbytes // len(key) + 1))[:nbytes]


class PayloadPlane:
    """The data plane of a ``--bytes`` replay (``sim.DataPlane``) over ``tiers``' host slab."""

    def __init__(self, tiers: TieredStore, clock: VirtualClock, slot_bytes: int) -> None:
        self.tiers, self.clock, self.slot_bytes = tiers, clock, slot_bytes
        self.written = self.verified = self.corrupt = 0
        self.seconds = 0.0
        """Wall time of the plane's own slot writes and verifying reads."""

    def store(self, job: TransferJob) -> None:
        start = time.perf_counter()
        for c in job.copies:
            self.tiers.backend.write(c.slot, payload(c.key, self.slot_bytes))
        self.written += len(job.copies)
        self.seconds += time.perf_counter() - start

    def load(self, job: TransferJob) -> list[ChunkKey]:
        start = time.perf_counter()
        n = self.slot_bytes
        bad = [c.key for c in job.copies if self.tiers.backend.read(c.slot, n) != payload(c.key, n)]
        self.verified += len(job.copies) - len(bad)
        self.corrupt += len(bad)
        self.seconds += time.perf_counter() - start
        return bad

    def settle(self, rounds: int) -> None:
        if not self.tiers.flush(timeout_s=60.0):
            raise RuntimeError("kvtier replay --bytes: tier work still running after 60 s")
        if rounds >= MAX_WAIT_ROUNDS:
            self.clock.now += GIVE_UP_S


class BytesTiers:
    """A ``TieredStore`` as the replay's store (``tiers.ReplayStore``): the planner's
    protocol passes through; ``locate``, ``hold`` and ``refresh`` serve the driver."""

    def __init__(self, tiers: TieredStore, disk: DiskTier | None, redis: RedisTier | None):
        self.tiers, self.disk, self.redis = tiers, disk, redis
        self.policy: Policy = tiers.host.policy
        self.promoted: dict[ChunkKey, str] = {}
        self._origin: dict[ChunkKey, str] = {}  # being promoted: from which tier

    @property
    def lock(self) -> Any:
        return self.tiers.lock

    def tier_slots(self) -> dict[str, int]:
        slots = {HOST: self.tiers.num_slots}
        if self.disk is not None:
            slots[DISK] = self.disk.capacity_chunks
        return slots

    def locate(self, keys: Iterable[ChunkKey]) -> list[str]:
        """Once background work is done: host, disk (its index) or Redis (EXISTS)."""
        ks = checked_keys(keys)
        self.tiers.flush(timeout_s=60.0)
        out = [HOST if s.readable else "" for s in self.tiers.host.lookup(ks)]
        for i, k in enumerate(ks):
            if not out[i] and self.disk is not None and self.disk.might_hold(k):
                out[i] = DISK
        rest = [i for i, w in enumerate(out) if not w]
        if rest and self.redis is not None:
            for i, there in zip(rest, self.redis.exists([ks[i] for i in rest]), strict=True):
                out[i] = REDIS if there else ""
        return out

    def lookup(self, keys: Iterable[ChunkKey]) -> list[ChunkState]:
        """``TieredStore.lookup``, remembering where each promoted chunk came from."""
        ks = checked_keys(keys)
        with self.lock:
            states = self.tiers.lookup(ks)
            for k, s in zip(ks, states, strict=True):
                if s is ChunkState.WRITING and k not in self._origin:
                    held = self.disk is not None and self.disk.might_hold(k)
                    self._origin[k] = DISK if held else REDIS
                elif s.readable and k in self._origin:
                    self.promoted[k] = self._origin.pop(k)
            return states

    def hold(self, keys: list[ChunkKey]) -> LoadHandle | None:
        """Pin the host-resident ``keys`` (not counted as tier hits); lower tiers keep
        recency through reads only, so the others are left alone."""
        host = [k for k, w in zip(keys, self.locate(keys), strict=True) if w == HOST]
        return self.tiers.host.prepare_load(host) if host else None

    def refresh(self, keys: list[ChunkKey]) -> None:
        self.tiers.touch(keys)

    def prepare_load(self, keys: Iterable[ChunkKey]) -> LoadHandle:
        return self.tiers.prepare_load(keys)

    def complete_load(self, handle: LoadHandle) -> None:
        self.tiers.complete_load(handle)

    def prepare_store(
        self, keys: Iterable[ChunkKey], parents: Sequence[ChunkKey | None] | None = None
    ) -> StoreHandle | StoreRefusal:
        ks = checked_keys(keys)
        for k in ks:  # stored afresh, not promoted
            self._origin.pop(k, None)
        return self.tiers.prepare_store(ks, parents)

    def complete_store(self, handle: StoreHandle, ok: bool) -> None:
        self.tiers.complete_store(handle, ok)

    def touch(self, keys: Iterable[ChunkKey]) -> int:
        return self.tiers.touch(keys)

    def remove(self, keys: Iterable[ChunkKey]) -> list[ChunkKey]:
        return self.tiers.remove(keys)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        return self.tiers.subscribe(callback)

    def check_invariants(self) -> None:
        self.tiers.check_invariants()


def build_tiers(
    layout: Layout, policy: Policy, host_slots: int, disk_slots: int, options: BytesOptions,
    disk_path: Path | None, clock: VirtualClock,
) -> BytesTiers:
    """Host slots of ``options.slot_bytes`` over a disk of ``disk_slots`` chunks (at
    ``disk_path``) and Redis, as the options ask."""
    n, geometry = options.slot_bytes, geometry_of(layout)
    host = ChunkStore(backend=HostSlab(host_slots, n, pin_memory=False), policy=policy)
    disk = redis = None
    if disk_slots:
        assert disk_path is not None
        disk = DiskTier(disk_path, disk_slots * (HEADER_BYTES + n), n, geometry=geometry,
                        fsync=options.fsync)
    if options.redis_url:
        redis = RedisTier(options.redis_url, namespace=f"kvtier-replay-{uuid.uuid4().hex[:12]}",
                          geometry=geometry, ttl_s=REDIS_TTL_S)
    lower: list[LowerTier] = [t for t in (disk, redis) if t is not None]
    tiers = TieredStore(host, lower, miss_ttl_s=MISS_TTL_S, clock=clock)
    return BytesTiers(tiers, disk, redis)


def replay_bytes(
    workload: Workload, policy: str, host_slots: int, disk_slots: int = 0,
    progress: Callable[[int], None] | None = None, *, options: BytesOptions | None = None,
) -> ReplayStats:
    """``sim.replay`` over real tiers (module docstring); the same arguments."""
    options = options or BytesOptions()
    started = time.perf_counter()
    if policy == INFINITE:
        host_slots, disk_slots = max(1, workload.num_distinct_chunks()), 0
    future = workload.future() if policy == "belady" else ()
    clock = VirtualClock()
    layout = workload.config.layout
    with _disk_dir(options, policy, disk_slots) as path:
        store = build_tiers(layout, build_policy(policy, host_slots, future), host_slots,
                            disk_slots, options, path, clock)
        try:
            plane = PayloadPlane(store.tiers, clock, options.slot_bytes)
            driver = Driver(workload.config, store, policy, clock=clock, plane=plane)
            assert driver.planner.wait_timeout_s < GIVE_UP_S < MISS_TTL_S
            for i, (req, refs) in enumerate(zip(workload.requests, workload.refs, strict=True)):
                clock.now += REQUEST_S
                driver.run(f"r{i}", req, refs)
                if progress is not None:
                    progress(1)
            store.tiers.flush(timeout_s=60.0)
            store.check_invariants()
        finally:
            store.tiers.close()
    stats = driver.stats
    stats.tiers = tier_report(store.tiers, plane, layout.max_bytes_per_chunk)
    stats.verified_chunks, stats.corrupt_chunks = plane.verified, plane.corrupt
    stats.wall_s = time.perf_counter() - started
    return stats


def tier_report(
    tiers: TieredStore, plane: PayloadPlane, real_chunk_bytes: int | None
) -> dict[str, dict[str, Any]]:
    """Per tier, fastest first: hits, chunks and bytes read and written (actually moved,
    and as the real layout's chunks would be), errors, and measured seconds."""
    snaps = tiers.stats()
    promoted = sum(s["promoted"] for name, s in snaps.items() if name != HOST)
    moved = {HOST: (plane.verified + plane.corrupt, plane.written + promoted, plane.seconds)}
    out = {}
    for name, s in snaps.items():
        read, written, seconds = moved.get(name, (
            s["hits"], s["stored"], s["read_seconds"] + s["write_seconds"]))
        real = real_chunk_bytes
        out[name] = {
            "hits": s["promoted"] if name != HOST else s["hits"],
            "chunks_read": read, "chunks_written": written,
            "bytes_read": read * plane.slot_bytes if name == HOST else s["bytes_read"],
            "bytes_written": written * plane.slot_bytes if name == HOST else s["bytes_written"],
            "real_bytes_read": None if real is None else read * real,
            "real_bytes_written": None if real is None else written * real,
            "seconds": seconds,
            **{k: s[k] for k in ("corrupt", "errors", "refused", "evicted")},
        }
    return out


def check_options(options: BytesOptions, policies: Sequence[str], disk: bool) -> None:
    """ValueError, one line, if ``--disk-dir`` is not a writable directory free of an
    earlier run's chunks, or ``--redis`` is malformed or does not answer."""
    if options.disk_dir is not None:
        base = Path(options.disk_dir)
        try:
            base.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=base):
                pass
        except OSError as e:
            raise ValueError(f"--disk-dir {base}: not a writable directory "
                             f"({e.strerror or e})") from None
        for p in policies:
            chunks = base / p / "chunks"
            if disk and chunks.is_dir() and any(chunks.iterdir()):
                raise ValueError(f"--disk-dir {base}: {chunks} holds an earlier run's chunks; "
                                 "give an empty directory")
    if options.redis_url is not None:
        try:
            tier = RedisTier(options.redis_url, timeout_s=2.0)
        except ValueError as e:
            raise ValueError(f"--redis: {e}") from None
        try:
            try:
                tier.exists([ChunkKey(bytes(40))])
            except ImportError as e:
                raise ValueError(f"--redis: {e}") from None
            if not tier.healthy:
                raise ValueError(f"--redis {options.redis_url}: the server does not answer")
        finally:
            tier.close()


@contextmanager
def _disk_dir(options: BytesOptions, policy: str, disk_slots: int) -> Iterator[Path | None]:
    """The disk tier's directory for one policy's replay: ``<disk_dir>/<policy>``, or a
    temporary directory removed afterwards."""
    if not disk_slots:
        yield None
    elif options.disk_dir is None:
        with tempfile.TemporaryDirectory(prefix="kvtier-replay-") as d:
            yield Path(d)
    else:
        yield Path(options.disk_dir) / policy
