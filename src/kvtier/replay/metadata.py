"""Host memory over an optional disk tier, metadata only, for the replay.

``kvtier.store.tiered.TieredStore`` moves real bytes through real disk files; a
capacity-planning replay of hundreds of thousands of multi-megabyte chunks needs only
where each chunk is. ``MetadataTiers`` is a ``ChunkStore`` (the host tier, evicting by the
chosen policy) that follows the same rules as ``TieredStore`` with ``write-back``:

* a chunk evicted from host memory is written down to disk (the disk tier evicts LRU);
* ``lookup`` brings a chunk found only on disk back into a host slot (promotion, counted
  as a disk read) and reports it ready; exclusive tiers, so it leaves the disk. If the host
  cannot take it (every slot pinned or offered), it stays on disk and reads as absent.

The planner drives it unchanged. ``locate`` and ``hold`` let the replay inspect and
refresh chunks without promoting them.

>>> from kvtier.keys import ChunkKey
>>> a, b = ChunkKey(bytes([1]) * 40), ChunkKey(bytes([2]) * 40)
>>> tiers = MetadataTiers(1, disk_slots=4)
>>> for k in (a, b): tiers.complete_store(tiers.prepare_store([k]), ok=True)
>>> tiers.locate([a, b])          # a was evicted to disk by b
['disk', 'host']
>>> [s.value for s in tiers.lookup([a])], tiers.disk_reads, tiers.locate([a, b])
(['ready'], 1, ['host', 'disk'])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kvtier.keys import ChunkKey
from kvtier.store import ChunkState, ChunkStore, EventKind, LoadHandle, Policy, StoreHandle
from kvtier.store.manager import checked_keys
from kvtier.store.protocol import StoreProtocol
from kvtier.store.results import StoreEvent

HOST, DISK, REDIS = "host", "disk", "redis"


class ReplayStore(StoreProtocol, Protocol):
    """What the replay's driver needs of its store beyond the planner's protocol:
    ``MetadataTiers`` here, ``kvtier.replay.bytes_store.BytesTiers`` with ``--bytes``."""

    policy: Policy
    promoted: dict[ChunkKey, str]
    """Keys promoted into host memory since the caller last cleared it, with their tier."""

    def tier_slots(self) -> dict[str, int]:
        """Slots per tier, fastest first (a tier without a slot count, Redis, omitted)."""
        ...

    def locate(self, keys: Iterable[ChunkKey]) -> list[str]:
        """The tier holding each key, or ``""``; changes nothing."""
        ...

    def hold(self, keys: list[ChunkKey]) -> LoadHandle | None:
        """Pin the host-resident keys, count a use of the others; ``complete_load`` it."""
        ...

    def refresh(self, keys: list[ChunkKey]) -> None:
        """Count a use of each key wherever it is, without promoting."""
        ...


class MetadataTiers(ChunkStore):
    """``num_slots`` host slots by ``policy``, above ``disk_slots`` disk slots (LRU)."""

    def __init__(
        self, num_slots: int, *, policy: str | Policy = "lru", disk_slots: int = 0
    ) -> None:
        super().__init__(num_slots, policy=policy)
        self.disk = ChunkStore(disk_slots, policy="lru") if disk_slots else None
        self.disk_reads = 0
        """Chunks promoted from disk to host."""
        self.disk_writes = 0
        """Chunks written down to disk (host evictions the disk accepted)."""
        self.promoted: dict[ChunkKey, str] = {}
        """Keys promoted since the caller last cleared it, with their tier (``disk``)."""
        if self.disk is not None:
            self.subscribe(self._write_down)

    def tier_slots(self) -> dict[str, int]:
        """Slots of host memory, and of the disk when modelled."""
        slots = {HOST: self.num_slots}
        if self.disk is not None:
            slots[DISK] = self.disk.num_slots
        return slots

    def _write_down(self, event: StoreEvent) -> None:
        if event.kind is not EventKind.EVICTED:
            return
        assert self.disk is not None
        handle = self.disk.prepare_store([event.key])
        if isinstance(handle, StoreHandle):
            self.disk.complete_store(handle, True)
            self.disk_writes += len(handle.keys)

    def locate(self, keys: Iterable[ChunkKey]) -> list[str]:
        """``host``, ``disk`` or ``""`` (absent or not readable) per key; changes nothing."""
        ks = checked_keys(keys)
        host = super().lookup(ks)
        out = [HOST if s.readable else "" for s in host]
        if self.disk is not None and "" in out:
            for i, s in enumerate(self.disk.lookup(ks)):
                if not out[i] and s.readable:
                    out[i] = DISK
        return out

    def lookup(self, keys: Iterable[ChunkKey]) -> list[ChunkState]:
        """Host states after promoting the chunks found only on disk."""
        ks = checked_keys(keys)
        with self.lock:
            states = super().lookup(ks)
            if self.disk is None or ChunkState.ABSENT not in states:
                return states
            on_disk = [k for k, s in zip(ks, self.disk.lookup(ks), strict=True) if s.readable]
            up = [k for k in on_disk if k not in self._slots]
            if up and self._promote(ks, up):
                states = super().lookup(ks)
            return states

    def _promote(self, asked: list[ChunkKey], up: list[ChunkKey]) -> bool:
        """Move ``up`` from disk into host slots, protecting the other ``asked`` chunks."""
        assert self.disk is not None
        held = [k for k in asked if k in self._slots]
        handle = super().prepare_store(held + up)
        if not isinstance(handle, StoreHandle):
            return False
        self.disk.remove(up)
        self.complete_store(handle, True)
        self.disk_reads += len(up)
        self.promoted.update(dict.fromkeys(up, DISK))
        return True

    def hold(self, keys: list[ChunkKey]) -> LoadHandle | None:
        """Pin the host-resident ``keys`` (safe from eviction; ``complete_load`` releases
        them and counts the access) and refresh the disk-resident ones there, without
        promoting."""
        where = self.locate(keys)
        if self.disk is not None:
            self.disk.touch([k for k, w in zip(keys, where, strict=True) if w == DISK])
        host = [k for k, w in zip(keys, where, strict=True) if w == HOST]
        return self.prepare_load(host) if host else None

    def refresh(self, keys: list[ChunkKey]) -> None:
        """Count a use of each key wherever it is (host or disk), without promoting."""
        self.touch(keys)
        if self.disk is not None:
            self.disk.touch(keys)
