"""One worker's tiers below its host slab: promotions, write-back and write-through.

The scheduler side and the protocol are in ``kvtier.integrations.vllm.tiers``. A worker
(rank ``r``) opens its own disk directory and Redis namespace (``tiers.rank_tiers``); the
disk tier hands its evictions to Redis under write-back. Promotions and write-through run on
one tier thread of the worker, in order, each ending in a future the worker polls; write-back
copies the evicted chunks' bytes at once (the caller does so before any job of the plan
runs) and leaves the writing to the tier's own workers.

>>> import tempfile
>>> from kvtier.keys import ChunkKey
>>> from kvtier.tiers.config import TierConfig
>>> from kvtier.tiers.host import HostSlab
>>> slab, k = HostSlab(2, 64, pin_memory=False), ChunkKey(bytes(40))
>>> with tempfile.TemporaryDirectory() as d:
...     cfg = TierConfig.from_dict({"host": {"capacity": 128},
...                                 "disk": {"path": d, "capacity": "1MiB", "fsync": False}})
...     tiers = RankTiers(cfg, rank=0, slot_bytes=64)
...     slab.write(0, b"kv" * 8)
...     tiers.demote(slab, [(k, 0, 16)])
...     tiers.drain()
...     tiers.promote(slab, "disk", (k,), (1,)), slab.read(1, 16)
...     tiers.close()
(True, b'kvkvkvkvkvkvkvkv')
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from kvtier.integrations.vllm.tiers import rank_tiers
from kvtier.keys import ChunkKey
from kvtier.tiers.build import lower_tiers
from kvtier.tiers.config import TierConfig
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.host import HostSlab
from kvtier.tiers.lower import Item, LowerTier, Workers
from kvtier.tiers.redis.tier import RedisTier

Copy = tuple[ChunkKey, int, int]
"""A chunk in the slab: its key, its slot, and its length in bytes."""


class RankTiers:
    """Rank ``rank``'s lower tiers (module docstring); ``slot_bytes``: the largest chunk,
    ``geometry``: the layout's fingerprint (``records.format.geometry_of``)."""

    def __init__(self, config: TierConfig, rank: int, slot_bytes: int,
                 geometry: bytes = b"") -> None:
        self.lower = lower_tiers(rank_tiers(config, rank), slot_bytes, geometry)
        if not self.lower:
            raise ValueError("RankTiers: the configuration names no tier below host memory")
        self._by_name = {t.name: t for t in self.lower}
        self.write_through = config.write_policy == "write-through"
        if not self.write_through:
            for upper, below in itertools.pairwise(self.lower):
                upper.set_demote(_demoter(below))
        self._thread = Workers("tiers", 1)
        self._writes: list[Future[list[ChunkKey]]] = []
        self._lock = threading.Lock()  # _writes: the caller's thread and the tier thread

    def submit(self, task: Callable[[], bool]) -> Future[bool]:
        """Run ``task`` on the tier thread (after every task submitted before it)."""
        return self._thread.submit(task)

    def promote(self, slab: HostSlab, tier: str, keys: Sequence[ChunkKey],
                slots: Sequence[int]) -> bool:
        """Blocking: read ``keys`` from ``tier`` into ``slots``; False unless every record
        was found and verified (nothing is written then). A chunk from a slower tier is
        also written to the faster ones, so evicting it again writes nothing."""
        source = self._by_name[tier]
        above = self.lower[: self.lower.index(source)]
        if isinstance(source, DiskTier | RedisTier):
            # read into the slots themselves: no buffer per record, no second copy (the
            # slots are the promotion's alone until it reports; a failed one frees them)
            got = source.get_into(list(keys), [memoryview(slab.view(s).data) for s in slots])
            if len(got) != len(keys):
                return False
            if above:  # copied now: the slots are the store's again once this reports
                items: list[Item] = [(k, bytes(got[k])) for k in keys]
                for t in above:
                    self._track(t.put_async(items))
            return True
        got = source.get(list(keys))
        if len(got) != len(keys):
            return False
        for k, slot in zip(keys, slots, strict=True):
            slab.write(slot, got[k])
        for t in above:
            self._track(t.put_async([(k, got[k]) for k in keys]))
        return True

    def demote(self, slab: HostSlab, copies: Sequence[Copy]) -> None:
        """Write-back: copy each chunk out of its slot now, and write the copies to the
        first lower tier on its own workers."""
        if copies:
            items: list[Item] = [(k, slab.read(slot, n)) for k, slot, n in copies]
            self._track(self.lower[0].put_async(items))

    def write_every_tier(self, slab: HostSlab, copies: Sequence[Copy]) -> bool:
        """Blocking: write each chunk to every lower tier (a refusal there is no failure:
        the chunk is in host memory); True."""
        items: list[Item] = [(k, slab.read(slot, n)) for k, slot, n in copies]
        for tier in self.lower:
            tier.put(items)
        return True

    def _track(self, write: Future[list[ChunkKey]]) -> None:
        with self._lock:
            self._writes = [w for w in self._writes if not w.done()]
            self._writes.append(write)

    def drain(self) -> None:
        """Wait for the tier thread and every write handed to a tier so far (tests)."""
        self._thread.submit(bool).result()
        self._wait_writes()

    def _wait_writes(self) -> None:
        with self._lock:
            writes, self._writes = self._writes, []
        for w in writes:
            w.exception()

    def close(self) -> None:
        """Finish queued work, then close every tier (a disk tier releases its directory);
        closing twice is harmless."""
        self._thread.close()
        self._wait_writes()
        for tier in self.lower:
            tier.close()


def _demoter(below: LowerTier) -> Callable[[ChunkKey, bytes], None]:
    def demote(key: ChunkKey, payload: bytes) -> None:
        below.put_async([(key, payload)])

    return demote
