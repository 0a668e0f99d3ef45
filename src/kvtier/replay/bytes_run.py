"""``kvtier replay --bytes``: the options, the run, the per-tier report.

``replay_bytes`` is ``driver.replay`` over the real tiers of ``kvtier.replay.bytes_store``,
with its data plane writing and verifying every chunk. Capacities are counted in the
layout's real chunk bytes (``slots = capacity // real chunk bytes``, as without
``--bytes``), each slot holding ``BytesOptions.slot_bytes``; ``tier_report`` gives bytes
both as the real layout's (chunks times real chunk bytes) and as actually moved.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.keys import ChunkKey
from kvtier.replay.bytes_store import GIVE_UP_S, MISS_TTL_S, REQUEST_S, PayloadPlane, bytes_tiers
from kvtier.replay.driver import Driver, VirtualClock, Workload, replay_policy
from kvtier.replay.stats import ReplayStats
from kvtier.replay.store import HOST
from kvtier.tiers.redis.tier import RedisTier
from kvtier.tiers.tiered import TieredStore


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


def replay_bytes(
    workload: Workload, policy: str, host_slots: int, disk_slots: int = 0,
    progress: Callable[[int], None] | None = None, *, options: BytesOptions | None = None,
) -> ReplayStats:
    """``driver.replay`` over real tiers (module docstring); the same arguments."""
    options = options or BytesOptions()
    started = time.perf_counter()
    built, host_slots, disk_slots = replay_policy(workload, policy, host_slots, disk_slots)
    clock = VirtualClock()
    layout = workload.config.layout
    with _disk_dir(options, policy, disk_slots) as path:
        store = bytes_tiers(layout, built, host_slots, disk_slots, slot_bytes=options.slot_bytes,
                            disk_path=path, redis_url=options.redis_url, fsync=options.fsync,
                            clock=clock, admission=workload.config.admission)
        try:
            plane = PayloadPlane(store, clock, options.slot_bytes)
            driver = Driver(workload.config, store, policy, clock=clock, plane=plane)
            assert driver.planner.wait_timeout_s < GIVE_UP_S < MISS_TTL_S
            for i, (req, refs) in enumerate(workload.items(progress)):
                clock.now += REQUEST_S
                driver.run(f"r{i}", req, refs)
            store.flush(timeout_s=60.0)
            store.check_invariants()
        finally:
            store.close()
    stats = driver.stats
    stats.tiers = tier_report(store, plane, layout.max_bytes_per_chunk)
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
    earlier run's chunks, or ``--redis`` is malformed, refuses the login or does not answer
    (the URL shown with its password hidden)."""
    if options.disk_dir is not None:
        _check_disk_dir(Path(options.disk_dir), policies, disk)
    if options.redis_url is not None:
        _check_redis(options.redis_url)


def _check_disk_dir(base: Path, policies: Sequence[str], disk: bool) -> None:
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


def _check_redis(url: str) -> None:
    try:
        tier = RedisTier(url, timeout_s=2.0)
    except ValueError as e:
        raise ValueError(f"--redis: {e}") from None
    try:
        try:
            tier.exists([ChunkKey(bytes(40))])
        except ImportError as e:
            raise ValueError(f"--redis: {e}") from None
        if not tier.healthy:
            raise ValueError(f"--redis {tier.url}: {tier.last_error}")
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
