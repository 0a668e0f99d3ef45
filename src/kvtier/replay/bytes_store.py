"""The ``--bytes`` replay's store and data plane: real tiers, real bytes, every load checked.

The metadata replay (``kvtier.replay.metadata``) knows where each chunk is; this store also
moves and checks its bytes through kvtier's real tiers: a ``HostSlab`` of real slots under
the host ``ChunkStore``, a ``DiskTier`` of checksummed files in a directory, a
``RedisTier`` on a server, under the same ``ReplayStore`` (``kvtier.replay.store``: the
real ``TieredStore``, exclusive placement). The planner and the driver
(``kvtier.replay.driver.Driver``) are the same; ``kvtier.replay.bytes_run`` runs it.

* **Scaled slots.** Capacities are counted in the layout's real chunk bytes, but each slot
  holds only ``slot_bytes`` bytes, so a replay of 64 GiB of host memory fits a laptop.
* **The data plane** (``PayloadPlane``): a store job fills each chunk's host slot with
  ``payload(key)`` (the key repeated), and a load job reads each slot back and compares it
  byte for byte: ``verified`` and ``corrupt`` (any is a kvtier bug; the hit is then rolled
  back).
* **Promotions** go through the real path: ``TieredStore.lookup`` reports a chunk found
  below as WRITING and fetches it on the tier's workers; the planner answers WAIT; the
  plane's ``settle`` waits for the background work (``TieredStore.flush``) and the driver
  asks again. The planner and the store share a virtual clock that advances one second per
  request (``REQUEST_S``) and never during one, so waits never time out by accident and a
  chunk found nowhere is remembered as absent within its request only (``MISS_TTL_S``).
  Between requests all background work is complete (``ReplayStore.locate`` flushes), so a
  replay is deterministic while the disk does not evict (its workers may publish
  concurrent write-backs in either order, which its LRU then sees).

Where this replay differs from the metadata replay, the tiers differ, not the rules: a
promotion completes over WAIT rounds rather than within the lookup, so the planner may
ask for a request's chunks in a different order; a disk tier keeps recency through reads
only (``DiskTier`` cannot count a use without one; the ``MetadataTier`` refreshes a chunk a
request references); and the disk's workers may write back and remove concurrently. With
a disk that never evicts, both hold every chunk ever stored, so block and token hit rates
are equal (tested).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from kvtier.keys import ChunkKey
from kvtier.layout import Layout
from kvtier.planner import TransferJob
from kvtier.replay.driver import VirtualClock
from kvtier.replay.store import ReplayStore
from kvtier.store import ChunkStore, Policy
from kvtier.store.admission import Admission
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.host import HostSlab
from kvtier.tiers.lower import LowerTier
from kvtier.tiers.records.format import HEADER_BYTES, geometry_of
from kvtier.tiers.redis.tier import RedisTier

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


def payload(key: ChunkKey, nbytes: int) -> bytes:
    """The bytes the replay stores for ``key``: the key repeated, cut to ``nbytes``.

    >>> payload(ChunkKey(bytes(range(40))), 43)[-4:]
    b"'\\x00\\x01\\x02"
    """
    return (bytes(key) * (nbytes // len(key) + 1))[:nbytes]


class PayloadPlane:
    """The data plane of a ``--bytes`` replay (``driver.DataPlane``) over ``tiers``' host
    slab."""

    def __init__(self, tiers: ReplayStore, clock: VirtualClock, slot_bytes: int) -> None:
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


def bytes_tiers(
    layout: Layout, policy: Policy, host_slots: int, disk_slots: int, *, slot_bytes: int,
    disk_path: Path | None, redis_url: str | None, fsync: bool, clock: VirtualClock,
    admission: Admission | None = None,
) -> ReplayStore:
    """Host slots of ``slot_bytes`` over a disk of ``disk_slots`` chunks (at ``disk_path``)
    and Redis at ``redis_url``, each where asked for; ``admission`` filters the host's new
    chunks."""
    geometry = geometry_of(layout)
    host = ChunkStore(backend=HostSlab(host_slots, slot_bytes, pin_memory=False), policy=policy,
                      admission=admission)
    lower: list[LowerTier] = []
    if disk_slots:
        assert disk_path is not None
        lower.append(DiskTier(disk_path, disk_slots * (HEADER_BYTES + slot_bytes), slot_bytes,
                              geometry=geometry, fsync=fsync))
    if redis_url:
        lower.append(RedisTier(redis_url, namespace=f"kvtier-replay-{uuid.uuid4().hex[:12]}",
                               geometry=geometry, ttl_s=REDIS_TTL_S))
    return ReplayStore(host, lower, miss_ttl_s=MISS_TTL_S, clock=clock)
