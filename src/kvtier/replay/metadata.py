"""The metadata replay's store: the real ``TieredStore`` over tiers that hold no bytes.

A capacity-planning replay of hundreds of thousands of multi-megabyte chunks needs only
where each chunk is. ``metadata_store`` builds a ``ReplayStore`` (``kvtier.replay.store``)
over a host ``ChunkStore`` of zero-byte slots (``NoBytes``, evicting by the chosen policy)
and, when a disk is modelled, a ``MetadataTier`` of ``disk_slots`` (LRU); both are
``kvtier.tiers.metadata``'s. So the rules are the real store's:

* a chunk evicted from host memory is written down to disk (write-back);
* ``lookup`` promotes a chunk found only on disk into a host slot, within the call (the
  tiers are synchronous), and reports it ready; placement is exclusive, so it leaves the
  disk. If the host cannot take it without evicting the lookup's other chunks, it stays
  on disk and reads as absent.

A synchronous tier answers exactly, so no miss is remembered (``miss_ttl_s=0``) and the
replay is deterministic.

>>> from kvtier.keys import ChunkKey
>>> a, b = ChunkKey(bytes([1]) * 40), ChunkKey(bytes([2]) * 40)
>>> tiers = metadata_store(1, disk_slots=4)
>>> for k in (a, b): tiers.complete_store(tiers.prepare_store([k]), ok=True)
>>> tiers.locate([a, b])          # a was evicted to disk by b
['disk', 'host']
>>> [s.value for s in tiers.lookup([a])], tiers.promoted == {a: "disk"}, tiers.locate([a, b])
(['ready'], True, ['host', 'disk'])
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.replay.store import DISK, ReplayStore
from kvtier.store import ChunkStore, Policy
from kvtier.store.admission import Admission
from kvtier.tiers.lower import LowerTier
from kvtier.tiers.metadata import MetadataTier, NoBytes


def metadata_store(
    host_slots: int, *, policy: str | Policy = "lru", disk_slots: int = 0,
    below: Sequence[LowerTier] = (), admission: Admission | None = None,
) -> ReplayStore:
    """``host_slots`` host slots by ``policy``, above ``disk_slots`` disk slots (LRU), above
    the tiers ``below`` (a fleet's shared tier, ``kvtier.replay.fleet``); ``admission``
    filters the host's new chunks (``kvtier.store.admission``)."""
    host = ChunkStore(backend=NoBytes(host_slots), policy=policy, admission=admission)
    lower: list[LowerTier] = [MetadataTier(DISK, disk_slots)] if disk_slots else []
    return ReplayStore(host, [*lower, *below], miss_ttl_s=0.0)
