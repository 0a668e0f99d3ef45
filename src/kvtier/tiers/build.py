"""The tiers below host memory that a ``TierConfig`` names, built in the hierarchy's order.

``TIER_BUILDERS`` is the registry: one builder per config section, fastest tier first. A new
tier adds its section to ``TierConfig`` and its builder here; ``TieredStore.from_config`` and
the vLLM connector's per-rank tiers both build through ``lower_tiers``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kvtier.tiers.config import DiskConfig, RedisConfig, TierConfig
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.lower import LowerTier
from kvtier.tiers.redis.tier import Backoff, RedisTier

Builder = Callable[[Any, int, bytes, Callable[[], float]], LowerTier]
"""``build(config section, slot_bytes, geometry, clock)``: one tier."""


def _build_disk(
    cfg: DiskConfig, slot_bytes: int, geometry: bytes, clock: Callable[[], float]
) -> LowerTier:
    return DiskTier(cfg.path, cfg.capacity_bytes, slot_bytes, geometry=geometry,
                    policy=cfg.policy, workers=cfg.workers, fsync=cfg.fsync, seal=cfg.seal())


def _build_redis(
    cfg: RedisConfig, slot_bytes: int, geometry: bytes, clock: Callable[[], float]
) -> LowerTier:
    backoff = Backoff(cfg.backoff_initial_s, cfg.backoff_max_s)
    return RedisTier(cfg.url, cluster_nodes=cfg.cluster_nodes, namespace=cfg.namespace,
                     geometry=geometry,
                     timeout_s=cfg.timeout_s, backoff=backoff, ttl_s=cfg.ttl_s,
                     workers=cfg.workers, clock=clock, username=cfg.username,
                     password=cfg.password(), seal=cfg.seal())


TIER_BUILDERS: dict[str, Builder] = {
    "disk": _build_disk,
    "redis": _build_redis,
}
"""Lower tiers by config section, fastest first: the hierarchy's order."""


def lower_tiers(config: TierConfig, slot_bytes: int, geometry: bytes,
                clock: Callable[[], float] = time.monotonic) -> list[LowerTier]:
    """The lower tiers ``config`` names, fastest first, for ``slot_bytes``-byte chunks of a
    layout whose fingerprint is ``geometry`` (``records.format.geometry_of``)."""
    return [build(section, slot_bytes, geometry, clock)
            for name, build in TIER_BUILDERS.items()
            if (section := getattr(config, name)) is not None]
