"""The tiers: where a chunk's bytes live, fastest first (DESIGN section 2).

* ``tiered``: ``TieredStore``, the hierarchy (host memory above disk above Redis), built from
  one ``TierConfig`` (``config``); ``lower`` is what every tier below host memory offers.
* ``host``: ``HostSlab``, one preallocated slab of slots in host memory.
* ``disk/``: a bounded directory of records that survives restarts.
* ``redis/``: one Redis server or a Redis Cluster shared by a fleet.
* ``records/``: the format a chunk travels in below host memory, and its seals.
* ``metadata``: the same tier rules without the bytes, for the replay.

Each tier keeps its chunks through a ``kvtier.store.ChunkStore`` over its own slots; the
store decides what to keep and knows none of these. Names load on first use, so importing
one tier does not import the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "TieredStore": "kvtier.tiers.tiered",
    "TierConfig": "kvtier.tiers.config",
    "HostConfig": "kvtier.tiers.config",
    "DiskConfig": "kvtier.tiers.config",
    "RedisConfig": "kvtier.tiers.config",
    "HostSlab": "kvtier.tiers.host",
    "host_store": "kvtier.tiers.host",
    "DiskTier": "kvtier.tiers.disk.tier",
    "RedisTier": "kvtier.tiers.redis.tier",
    "LowerTier": "kvtier.tiers.lower",
}

__all__ = [
    "DiskConfig",
    "DiskTier",
    "HostConfig",
    "HostSlab",
    "LowerTier",
    "RedisConfig",
    "RedisTier",
    "TierConfig",
    "TieredStore",
    "host_store",
]


def __getattr__(name: str) -> Any:
    home = _EXPORTS.get(name)
    if home is None:
        raise AttributeError(f"module 'kvtier.tiers' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from kvtier.tiers.config import DiskConfig, HostConfig, RedisConfig, TierConfig
    from kvtier.tiers.disk.tier import DiskTier
    from kvtier.tiers.host import HostSlab, host_store
    from kvtier.tiers.lower import LowerTier
    from kvtier.tiers.redis.tier import RedisTier
    from kvtier.tiers.tiered import TieredStore
