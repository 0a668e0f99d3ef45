"""Fleet replay: many engines behind a router, each with its own tiers, over one shared tier
(``kvtier replay --instances N --router NAME``; docs/replay.md).

Every engine is the single-engine replay's: a ``Driver`` over its own ``ReplayStore``, built
by ``driver.make_store`` (host memory by the policy, and a disk when given). With
``shared_slots`` the fleet adds one shared tier (a ``MetadataTier``, LRU) below every
engine's own tiers (``SharedView``): an engine's evictions reach it last, any engine finds
chunks there, and a promotion copies a chunk up without taking it from the others.

A router (``kvtier.replay.routers``) picks the engine of each request, through this fleet's
``FleetView``: an engine's load, in prefill tokens, and the prefix of a request it holds in
any tier (``driver.block_hit`` over the engine's ``locate``, which changes nothing). The
load depends on the mode:

* sequential (default): requests one after another, each on its engine; an engine's load is
  the prefill tokens (prompt less hit) of every request it has served so far;
* concurrent: at the trace's timestamps (``concurrent.Sim``), a FIFO queue and
  ``prefill_slots`` per engine; an engine's load is its prefill work not yet done.

With one engine and no shared tier, every router gives exactly the single-engine replay.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvtier.keys import ChunkKey
from kvtier.layout import Layout
from kvtier.replay.concurrent import Sim
from kvtier.replay.driver import (
    Driver,
    HitPlans,
    VirtualClock,
    Workload,
    block_hit,
    make_store,
)
from kvtier.replay.fleet_stats import FleetStats
from kvtier.replay.refs import RequestRefs
from kvtier.replay.routers import Router, RouterSpec
from kvtier.tiers.lower import AsyncTwins, Demote, Inline, Item
from kvtier.tiers.metadata import MetadataTier

SHARED = "shared"
"""The shared tier's name: its loads count under it (``ReplayStats.chunks_loaded_by_tier``)."""
MAX_INSTANCES = 1024
"""The most engines one fleet replay models."""
BELADY_NEEDS_ONE = ("belady needs each engine's future, which the router decides as it goes; "
                    "give --instances 1 or another policy")


@dataclass(frozen=True)
class FleetOptions:
    """The fleet around each engine."""

    instances: int = 1
    """Engines, each with the host (and disk) slots given to the replay."""
    router: RouterSpec = field(default_factory=lambda: RouterSpec("round_robin"))
    shared_slots: int = 0
    """Slots of the shared tier below every engine (0: none)."""
    concurrent: bool = False
    """Replay at the trace's timestamps (module docstring)."""

    def __post_init__(self) -> None:
        n = self.instances
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_INSTANCES:
            raise ValueError(f"--instances must be an integer in [1, {MAX_INSTANCES}], got {n!r}")
        s = self.shared_slots
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"the shared tier's slots must be an integer >= 0, got {s!r}")


class SharedView(AsyncTwins):
    """One engine's handle on the fleet's shared tier: reads, writes and uses go to the one
    ``MetadataTier``, but a promotion leaves the chunk there (``remove`` does nothing), for
    the other engines; nothing is below it."""

    def __init__(self, tier: MetadataTier) -> None:
        self.name, self.tier, self.stats = SHARED, tier, tier.stats
        self._workers = Inline()

    @property
    def capacity_chunks(self) -> int:
        return self.tier.capacity_chunks

    def exists(self, keys: Sequence[ChunkKey]) -> list[bool]:
        return self.tier.exists(keys)

    def might_hold(self, key: ChunkKey) -> bool:
        return self.tier.might_hold(key)

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        return self.tier.get(keys)

    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        return self.tier.put(items)

    def touch(self, keys: Sequence[ChunkKey]) -> int:
        return self.tier.touch(keys)

    def remove(self, keys: Sequence[ChunkKey]) -> None:
        """Nothing: the other engines may still read the chunk here."""

    def set_demote(self, demote: Demote | None) -> None:
        """Nothing: no tier is below the shared one."""

    def check_invariants(self) -> None:
        self.tier.check_invariants()

    def close(self) -> None:
        """Nothing to release."""


class PrefixProbe:
    """Bounds a request's hit on an engine cheaply, before ``block_hit`` reads every key.

    A full-attention group without lookahead needs every chunk before a boundary
    (``retained(g, b) = [0, b)``), so its first absent chunk bounds the hit: ``reach`` finds
    it, reading the group's keys in doubling batches; ``truncate`` keeps the references a
    boundary within that bound can need (those storable by then: ``coverage.store_set``
    of a shorter horizon), so ``block_hit`` over them gives the same hit. A layout with no
    such group is read whole.
    """

    def __init__(self, layout: Layout) -> None:
        self.lookahead = layout.max_stored_lookahead
        self.group = next((gi for gi, g in enumerate(layout.groups)
                           if g.kind == "full" and not g.lookahead), None)
        self.tokens = layout.groups[self.group].tokens_per_chunk if self.group is not None else 0
        self._last: tuple[RequestRefs | None, list[ChunkKey]] = (None, [])

    def _keys(self, refs: RequestRefs) -> list[ChunkKey]:
        """The probed group's keys, in chunk order (kept for the last request)."""
        if self._last[0] is not refs:
            self._last = (refs, [k for k, g in zip(refs.keys, refs.groups, strict=True)
                                 if g == self.group])
        return self._last[1]

    def reach(self, refs: RequestRefs, locate: Callable[[list[ChunkKey]], list[str]]) -> int:
        """Tokens before the probed group's first absent chunk (the stored scope without
        such a group)."""
        if self.group is None:
            return refs.store_tokens
        keys, start, size = self._keys(refs), 0, 1
        while start < len(keys):
            where = locate(keys[start: start + size])
            if not all(where):
                return (start + where.index("")) * self.tokens
            start, size = start + size, size * 2
        return refs.store_tokens

    def truncate(self, refs: RequestRefs, reach: int) -> RequestRefs | None:
        """``refs`` as a producer storing ``reach`` tokens (plus lookahead) references
        them; None when no boundary fits."""
        top = min(refs.store_tokens, reach + self.lookahead)
        if top >= refs.store_tokens:
            return refs
        if reach <= 0:
            return None
        n = bisect.bisect_right(refs.horizons, top)
        return RequestRefs(refs.num_prompt, top, refs.keys[:n], refs.groups[:n],
                           refs.chunks[:n], refs.horizons[:n], refs.prompt,
                           refs.stored)


class Fleet:
    """The engines and the shared tier, seen by a router as a ``FleetView``."""

    def __init__(self, workload: Workload, policy: str, host_slots: int, disk_slots: int,
                 options: FleetOptions, clock: Callable[[], float] | None = None) -> None:
        if policy == "belady" and options.instances > 1:
            raise ValueError(BELADY_NEEDS_ONE)
        self.workload, self.layout = workload, workload.config.layout
        self.shared = MetadataTier(SHARED, options.shared_slots) if options.shared_slots else None
        self.drivers = [
            Driver(workload.config, make_store(workload, policy, host_slots, disk_slots,
                                               self._below()), policy, clock=clock)
            for _ in range(options.instances)]
        self.loads: list[int] = [0] * options.instances
        """Each engine's load (module docstring), kept by the mode that runs the fleet."""
        self._hits = HitPlans()
        self._probe = PrefixProbe(self.layout)

    def _below(self) -> list[SharedView]:
        return [SharedView(self.shared)] if self.shared is not None else []

    @property
    def num_engines(self) -> int:
        return len(self.drivers)

    def load(self, engine: int) -> float:
        return self.loads[engine]

    def held(self, engine: int, refs: RequestRefs) -> int:
        """``driver.block_hit`` over the engine's tiers, read only as far as the probe's
        prefix reaches (``PrefixProbe``)."""
        store = self.drivers[engine].store
        part = self._probe.truncate(refs, self._probe.reach(refs, store.locate))
        if part is None:
            return 0
        return block_hit(self.layout, part, store.locate_checked(part.keys), self._hits)


def replay_fleet(
    workload: Workload, policy: str, host_slots: int, disk_slots: int = 0, *,
    options: FleetOptions, progress: Callable[[int], None] | None = None,
) -> FleetStats:
    """Replay ``workload`` over a fleet of engines (module docstring) with ``policy``."""
    started = time.perf_counter()
    clock = VirtualClock() if options.concurrent else None
    fleet = Fleet(workload, policy, host_slots, disk_slots, options, clock)
    router = options.router.build(workload.config.block_tokens)
    if clock is None:
        assignment = _sequential(fleet, router, progress)
    else:
        assignment = _concurrent(fleet, router, clock, progress)
    return FleetStats(str(options.router), [d.stats for d in fleet.drivers], assignment,
                      options.shared_slots, time.perf_counter() - started)


def _sequential(fleet: Fleet, router: Router, progress: Callable[[int], None] | None
                ) -> list[int]:
    """Each request on its engine, one after another; the engine of each request."""
    assignment = []
    for i, (req, refs) in enumerate(fleet.workload.items(progress)):
        e = router.choose(req, refs, fleet)
        stats = fleet.drivers[e].stats
        hit_before = stats.hit_tokens
        fleet.drivers[e].run(f"r{i}", req, refs)
        fleet.loads[e] += req.input_length - (stats.hit_tokens - hit_before)
        assignment.append(e)
    return assignment


def _concurrent(fleet: Fleet, router: Router, clock: VirtualClock,
                progress: Callable[[int], None] | None) -> list[int]:
    """The requests at their timestamps (``concurrent.Sim``); the engine of each request."""
    assignment: list[int] = []

    def route(i: int) -> int:
        assert i == len(assignment), "requests arrive in trace order"
        req, refs = sim.window[i]
        assignment.append(router.choose(req, refs, fleet))
        return assignment[i]

    sim = Sim(fleet.workload, fleet.drivers, clock, route)
    fleet.loads = sim.outstanding
    sim.run(progress)
    return assignment
