"""Tiers that keep only where chunks are, for a ``TieredStore`` that moves no bytes.

A capacity-planning replay of hundreds of thousands of multi-megabyte chunks needs to know
which tier holds each chunk, not the chunk's bytes. So the metadata replay runs the real
``TieredStore`` (its write-back, promotion and placement rules) over:

* ``NoBytes``: a host backend of zero-byte slots (the host ``ChunkStore`` numbers them and
  evicts as ever; reading a slot gives ``b""``);
* ``MetadataTier``: a ``LowerTier`` holding keys only, in ``capacity_chunks`` slots of a
  metadata-only ``ChunkStore`` evicting by a policy (the accounting ``DiskTier`` uses for
  its files). It is synchronous (``Inline``): a hierarchy over it promotes within
  ``lookup``, and a replay over it is deterministic.

>>> from kvtier.keys import ChunkKey
>>> a, b = ChunkKey(bytes([1]) * 40), ChunkKey(bytes([2]) * 40)
>>> tier = MetadataTier("disk", 1)
>>> tier.put([(a, b""), (b, b"")]) == [a, b], tier.exists([a, b])   # b evicts a
(True, [False, True])
>>> list(tier.get([a, b])) == [b], tier.stats.evicted
(True, 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvtier.keys import ChunkKey
from kvtier.store.backend import BytesLike
from kvtier.store.manager import ChunkStore
from kvtier.store.policies import Policy
from kvtier.store.results import EventKind, StoreEvent, StoreHandle
from kvtier.tiers.lower import AsyncTwins, Demote, IndexEvents, Inline, Item, TierStats

_EMPTY = memoryview(b"")


class NoBytes:
    """A ``SlotBackend`` of ``num_slots`` zero-byte slots: a host that holds no bytes.

    >>> NoBytes(4).read(3), NoBytes(4).slot_bytes
    (b'', 0)
    """

    slot_bytes = 0

    def __init__(self, num_slots: int) -> None:
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"NoBytes: num_slots must be an integer >= 1, got {num_slots!r}")
        self.num_slots = num_slots

    def read(self, slot: int, nbytes: int | None = None) -> bytes:
        """``b""``: a slot holds nothing."""
        return b""

    def write(self, slot: int, data: BytesLike) -> None:
        """Accept an empty payload only (``ValueError`` for bytes: there is nowhere to put
        them)."""
        if memoryview(data).nbytes:  # type: ignore[arg-type]
            raise ValueError("NoBytes: a zero-byte slot cannot hold a payload; "
                             "use a HostSlab where chunks carry bytes")


class MetadataTier(AsyncTwins, IndexEvents):
    """Keys of up to ``capacity_chunks`` chunks, evicted by ``policy`` (see the module
    docstring); a hit reads an empty payload."""

    def __init__(self, name: str, capacity_chunks: int, *, policy: str | Policy = "lru"):
        self.name = name
        self.stats = TierStats(name)
        self._index = ChunkStore(capacity_chunks, policy=policy)
        self._index.subscribe(self._on_evict)
        self._demote: Demote | None = None
        self._evicted: list[ChunkKey] = []  # handed down once the index call returns
        self._workers = Inline()

    @property
    def capacity_chunks(self) -> int:
        return self._index.num_slots

    def exists(self, keys: Sequence[ChunkKey]) -> list[bool]:
        """Whether each key is held; changes nothing."""
        return [s.readable for s in self._index.lookup(keys)]

    def might_hold(self, key: ChunkKey) -> bool:
        """Whether ``key`` is held: exact, as no copy here can be lost or corrupt."""
        return self.exists([key])[0]

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        """An empty payload per held key; the read counts as a use of each."""
        with self._index.lock:
            held = [k for k, there in zip(keys, self.exists(keys), strict=True) if there]
            if held:
                self._index.complete_load(self._index.prepare_load(held))
        self.stats.add(hits=len(held), misses=len(keys) - len(held))
        return dict.fromkeys(held, _EMPTY)

    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        """Hold each key, one at a time, evicting by the policy; the keys now held."""
        held: list[ChunkKey] = []
        stored = 0
        for key, _ in items:
            handle = self._index.prepare_store([key])
            if isinstance(handle, StoreHandle):
                self._index.complete_store(handle, ok=True)
                stored += len(handle.keys)
                held.append(key)
        self.stats.add(stored=stored, refused=len(items) - len(held))
        self._hand_down()
        return held

    def remove(self, keys: Sequence[ChunkKey]) -> None:
        self._index.remove(keys)

    def touch(self, keys: Iterable[ChunkKey]) -> int:
        """Count a use of each held key (as a read would); how many were held."""
        return self._index.touch(keys)

    def set_demote(self, demote: Demote | None) -> None:
        """Hand evicted keys (with an empty payload) to ``demote``, or drop them."""
        self._demote = demote

    def _on_evict(self, event: StoreEvent) -> None:
        """Index subscriber, under the index lock: note the victim."""
        if event.kind is EventKind.EVICTED:
            self._evicted.append(event.key)

    def _hand_down(self) -> None:
        """Count the victims and hand them to ``demote``, outside the index lock."""
        with self._index.lock:
            evicted, self._evicted = self._evicted, []
        if evicted:
            self.stats.add(evicted=len(evicted))
        if self._demote is not None:
            for key in evicted:
                self._demote(key, b"")

    def check_invariants(self) -> None:
        self._index.check_invariants()

    def close(self) -> None:
        """Nothing to release."""
