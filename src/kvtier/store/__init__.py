"""The store: chunk manager, eviction policies and tiers (DESIGN section 5).

* ``ChunkStore`` (``manager``): the paired protocol, chunk states, accounting, the one
  eviction loop and the one lock.
* ``Policy`` and ``POLICIES`` / ``make_policy`` (``policies``): LRU, ARC, S3-FIFO, Belady.
* ``SlotBackend`` (``backend``): what a tier gives the manager; ``HostSlab`` (``host``), the
  host-memory tier.
"""

from kvtier.store.backend import SlotAllocator, SlotBackend, ZeroCopyBackend
from kvtier.store.host import HostSlab, slots_for_capacity
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
    "HostSlab",
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
    "slots_for_capacity",
]
