"""The store: what to keep (DESIGN section 5). Every tier keeps its chunks through it.

* ``ChunkStore`` (``manager``): the paired protocol, chunk states, accounting, the one
  eviction loop and the one lock.
* ``Policy`` and ``POLICIES`` / ``make_policy`` (``policies``): LRU, ARC, S3-FIFO, Belady.
* ``Admission`` (``admission``): which offered chunks are worth a slot.
* ``SlotBackend`` (``backend``): what a tier gives the manager. The tiers themselves (host
  memory, disk, Redis) are ``kvtier.tiers``; the store knows none of them.
"""

from kvtier.store.backend import SlotAllocator, SlotBackend, ZeroCopyBackend
from kvtier.store.manager import ChunkStore
from kvtier.store.policies import (
    ARC,
    LRU,
    ONLINE_POLICIES,
    POLICIES,
    S3FIFO,
    Belady,
    Policy,
    make_policy,
)
from kvtier.store.results import (
    KEY_BYTES,
    ChunkNotReadyError,
    ChunkState,
    EventKind,
    EventLog,
    HandleError,
    LoadHandle,
    StoreEvent,
    StoreHandle,
    StoreRefusal,
    checked_keys,
)

__all__ = [
    "ARC",
    "KEY_BYTES",
    "LRU",
    "ONLINE_POLICIES",
    "POLICIES",
    "S3FIFO",
    "Belady",
    "ChunkNotReadyError",
    "ChunkState",
    "ChunkStore",
    "EventKind",
    "EventLog",
    "HandleError",
    "LoadHandle",
    "Policy",
    "SlotAllocator",
    "SlotBackend",
    "StoreEvent",
    "StoreHandle",
    "StoreRefusal",
    "ZeroCopyBackend",
    "checked_keys",
    "make_policy",
]
