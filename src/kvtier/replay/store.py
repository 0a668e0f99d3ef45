"""The replay's store: the real ``TieredStore``, plus what the driver asks of it.

Both replays run the store's own write-back, promotion and placement rules
(``kvtier.tiers.tiered``); they differ only in the tiers underneath:

* the metadata replay (``kvtier.replay.metadata``): a host of zero-byte slots over a
  ``MetadataTier`` standing in for the disk, both synchronous, so a promotion completes
  within the lookup that finds the chunk below;
* ``--bytes`` (``kvtier.replay.bytes_store``): a ``HostSlab`` over a real ``DiskTier`` and
  ``RedisTier``, promoting on their workers while the planner WAITs.

Placement is exclusive in both (``PLACEMENT``): a promoted chunk leaves the tier below, so
host memory and the disk hold distinct chunks and their capacities add up.

Beyond the planner's protocol the driver asks where each chunk is (``locate``, to count
block hits anywhere), to keep the chunks a request references but does not load safe from
its own stores (``hold``), and to count their use without promoting them (``refresh``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from kvtier.keys import ChunkKey
from kvtier.replay.tier_kinds import Counting, Exact, Sized
from kvtier.store import ChunkStore, LoadHandle, Policy
from kvtier.store.results import ChunkState, checked_keys
from kvtier.tiers.lower import LowerTier
from kvtier.tiers.tiered import Placement, TieredStore

HOST: Final = "host"
DISK: Final = "disk"
REDIS: Final = "redis"
PLACEMENT: Placement = "exclusive"
"""The replays' placement (module docstring)."""


class ReplayStore(TieredStore):
    """``host`` above ``lower`` tiers (``TieredStore``) with exclusive placement, and the
    driver's queries (module docstring)."""

    def __init__(
        self, host: ChunkStore, lower: Sequence[LowerTier] = (), *, miss_ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(host, lower, placement=PLACEMENT, miss_ttl_s=miss_ttl_s, clock=clock)
        self.policy: Policy = host.policy
        self.promoted: dict[ChunkKey, str] = {}
        """Keys promoted into host memory since the caller last cleared it, with their tier."""
        self.watch_promotions(self.promoted.__setitem__)
        self._counting = [t for t in self.lower if isinstance(t, Counting)]

    def tier_slots(self) -> dict[str, int]:
        """Slots per tier, fastest first (a tier without a slot count, Redis, omitted)."""
        slots = {HOST: self.num_slots}
        slots.update((t.name, t.capacity_chunks) for t in self.lower if isinstance(t, Sized))
        return slots

    def locate(self, keys: Iterable[ChunkKey]) -> list[str]:
        """Once background work is done: the first tier holding each key, or ``""``
        (absent, or not readable yet); changes nothing."""
        return self.locate_checked(checked_keys(keys))

    def locate_checked(self, ks: list[ChunkKey]) -> list[str]:
        """``locate`` of keys known to be ``ChunkKey``s (a ``KeyChain``'s, as the replay's
        references are): not checked again."""
        self.flush(timeout_s=60.0)
        ready, pinned = ChunkState.READY, ChunkState.PINNED  # readable, by identity
        out = [HOST if s is ready or s is pinned else "" for s in self.host.lookup_checked(ks)]
        for tier in self.lower:
            rest = [i for i, w in enumerate(out) if not w]
            if not rest:
                break
            for i, there in zip(rest, _holds(tier, [ks[i] for i in rest]), strict=True):
                if there:
                    out[i] = tier.name
        return out

    def hold(self, keys: list[ChunkKey], where: list[str] | None = None) -> LoadHandle | None:
        """Pin the host-resident ``keys`` (safe from eviction; ``complete_load`` releases
        them and counts the use) and count a use of the others where they are, without
        promoting them. ``where``: their ``locate``, when the caller has it already."""
        where = self.locate(keys) if where is None else where
        if len(where) != len(keys):
            raise ValueError(f"hold: {len(where)} places for {len(keys)} keys; give one each")
        # bare zips (one place per key), which mypyc compiles into loops
        self._count_below([k for k, w in zip(keys, where) if w and w != HOST])  # noqa: B905
        host = [k for k, w in zip(keys, where) if w == HOST]  # noqa: B905
        return self.host.prepare_load(host) if host else None

    def refresh(self, keys: list[ChunkKey]) -> None:
        """Count a use of each key wherever it is, without promoting."""
        self.touch(keys)
        self._count_below(keys)

    def _count_below(self, keys: list[ChunkKey]) -> None:
        """Count a use of ``keys`` in every lower tier that can without a read (a tier
        that cannot keeps recency through its reads only)."""
        if keys:
            for tier in self._counting:
                tier.touch(keys)


def _holds(tier: LowerTier, keys: list[ChunkKey]) -> list[bool]:
    if isinstance(tier, Exact):
        return tier.exists(keys)
    return [tier.might_hold(k) for k in keys]
