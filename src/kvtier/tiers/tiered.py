"""The hierarchy: host memory above disk above Redis, behind ``ChunkStore``'s own protocol.

``TieredStore`` offers exactly what the Planner calls on a ``ChunkStore`` (``lock``,
``lookup``, ``prepare_load`` / ``complete_load``, ``prepare_store`` / ``complete_store``,
``touch``, ``remove``, ``subscribe``, ``check_invariants``), so a Planner drives it
unchanged. The data plane only ever touches host slots:

* Loads read host slots. ``lookup`` reports a chunk that is absent from host memory but may
  be below (``LowerTier.might_hold``, answered from memory) as WRITING and starts promoting
  it: the lower tiers are asked in order, on their own workers, and the first verified copy
  is stored into a host slot (``prepare_store`` / write / ``complete_store``). The Planner
  sees WRITING as "soon" and answers WAIT; asked again once the promotion finished, it
  sees READY and pins a hit. A chunk found nowhere is reported ABSENT for ``miss_ttl_s``
  (so a miss costs one WAIT, not a wait per lookup), or until it is written down.
  ``lookup`` itself never does I/O. A chunk evicted moments ago, still on its way down,
  is reported WRITING too, and fetched once it has landed. Installing a promotion
  protects the lookup's other chunks already in host memory: it never evicts what the
  same request is about to load (when there is no other room, the chunk stays below and
  the lookup sees it absent).
* Synchronous tiers (``lower.Inline``: ``MetadataTier``) finish a promotion within the
  ``lookup`` that starts it, which then reports the chunk READY (or ABSENT): no WAIT.
* ``placement="inclusive"`` (default): a promoted chunk stays in the tier it came from
  too, so evicting it again from host memory writes nothing new. ``"exclusive"``: it
  leaves that tier (making room there before host evictions are written down), so host
  memory and the tiers below hold distinct chunks and their capacities add up.
* Stores go to host slots. ``write_policy="write-back"`` (default): a chunk evicted from
  host memory is written to the next tier (the disk tier likewise hands its evictions to
  Redis). ``"write-through"``: a chunk is written to every lower tier when its host store
  completes, and evictions write nothing.

Ordering of write-back: the manager emits EVICTED under its lock, after freeing the slot
but before ``prepare_store`` returns the handle that reuses it, so the subscriber copies the
slot's bytes while they are still the victim's; the copies go down in one batch per call
(``put_async``) once the manager returns (``kvtier.tiers.writedown``): no manager hook.

Counters per tier: ``stats()`` (hits, promotions, bytes, errors, latency). ``flush()``
waits for background work (promotions, write-backs); tests and shutdown use it.

>>> from kvtier.store.manager import ChunkStore; from kvtier.tiers.host import HostSlab
>>> store = TieredStore(ChunkStore(backend=HostSlab(4, 64, pin_memory=False)))
>>> store.lookup([ChunkKey(bytes(40))])[0].value
'absent'
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from kvtier.keys import ChunkKey
from kvtier.layout import Layout
from kvtier.store.backend import SlotBackend
from kvtier.store.manager import ChunkStore, checked_keys
from kvtier.store.results import (
    ChunkState,
    EventCounts,
    EventKind,
    LoadHandle,
    StoreHandle,
    StoreRefusal,
    Subscriber,
    TierBatchSubscriber,
)
from kvtier.tiers.build import lower_tiers
from kvtier.tiers.config import TierConfig, WritePolicy
from kvtier.tiers.host import host_store
from kvtier.tiers.lower import EventSource, LowerTier, TierStats, subscribe_named, unsubscribe_all
from kvtier.tiers.records.format import geometry_of
from kvtier.tiers.writedown import Background, WriteDown

WRITE_POLICIES: tuple[str, ...] = get_args(WritePolicy)
Placement = Literal["inclusive", "exclusive"]
"""Whether a chunk promoted into host memory stays in the tier below too (module docstring)."""
PLACEMENTS: tuple[str, ...] = get_args(Placement)
Promoted = Callable[[ChunkKey, str], None]
"""Called with each chunk promoted into host memory and the name of the tier it came from."""
_log = logging.getLogger(__name__)
_STORED: Final = EventKind.STORED


@dataclass
class _Fetch:
    """One promotion on its way up: the keys sought, the lookup's keys (those in host memory
    are protected when the found ones are installed), and what was found so far (key ->
    (tier index, payload))."""

    keys: list[ChunkKey]
    asked: list[ChunkKey]
    found: dict[ChunkKey, tuple[int, memoryview]] = field(default_factory=dict)

    def rest(self) -> list[ChunkKey]:
        return [k for k in self.keys if k not in self.found]


class TieredStore:
    """``host`` (a ``ChunkStore`` over a ``HostSlab``) above ``lower`` tiers, fastest first."""

    def __init__(
        self, host: ChunkStore, lower: Sequence[LowerTier] = (), *,
        write_policy: WritePolicy = "write-back", placement: Placement = "inclusive",
        miss_ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if host.backend is None:
            raise ValueError("TieredStore: the host store needs a backend (a HostSlab, or "
                             "tiers.metadata.NoBytes for a store that moves no bytes)")
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if placement == "exclusive" and write_policy == "write-through":
            raise ValueError("placement='exclusive' needs write_policy='write-back': "
                             "write-through keeps a copy of every chunk below")
        if not miss_ttl_s >= 0:
            raise ValueError(f"miss_ttl_s must be >= 0, got {miss_ttl_s!r}")
        self.host, self.lower, self.write_policy = host, tuple(lower), write_policy
        self.placement = placement
        self.backend: SlotBackend = host.backend
        self.lock = host.lock
        """The host store's lock: hold it to make lookup and prepare_load atomic."""
        self.host_stats = TierStats("host")
        """Host counters: refused chunks, failed stores; and, while a latency watcher is
        attached (``kvtier.metrics``), each load's and store's time from ``prepare_*`` to
        ``complete_*`` (the data plane's copy) as a read or a write. ``stats()`` adds the
        chunks pinned for loads (``hits``), stored (promotions too) and evicted."""
        self._started: dict[int, float] = {}  # live handle id -> perf_counter at prepare
        self._host_watchers = self.host_stats._watchers  # its ``watched``, without a call
        self._host_hits = 0  # chunks pinned for loads (counted here: no call per load)
        self._host_events = EventCounts()
        host.subscribe_batches(self._host_events.batch)
        self._miss_ttl_s, self._clock = miss_ttl_s, clock
        self._fetching: set[ChunkKey] = set()  # being promoted: reported WRITING
        self._absent_until: dict[ChunkKey, float] = {}  # found nowhere: ABSENT until then
        self._background = Background(self.lock, self.host_stats)
        self._down = WriteDown(self.lower, write_policy, self.backend, self.lock,
                               self._background)
        self._watchers: list[Promoted] = []
        self._due = EventKind.EVICTED if write_policy == "write-back" else EventKind.STORED
        """The event that sends a chunk's bytes down (module docstring)."""
        self._zeroed = self.backend.slot_bytes > 0  # a freed slot has bytes to zero
        host.subscribe_batches(self._on_host_batch)

    @classmethod
    def from_config(
        cls, config: TierConfig, layout: Layout, *, clock: Callable[[], float] = time.monotonic
    ) -> TieredStore:
        """The hierarchy ``config`` describes, for chunks of ``layout``; its admission
        (``admit_after``) filters the engine's stores into host memory, never promotions."""
        host = host_store(layout, config.host.capacity_bytes, policy=config.host.policy,
                          pin_memory=config.host.pin_memory, admission=config.admission())
        slot_bytes, geometry = host.backend.slot_bytes, geometry_of(layout)  # type: ignore[union-attr]
        lower = lower_tiers(config, slot_bytes, geometry, clock)
        return cls(host, lower, write_policy=config.write_policy,
                   miss_ttl_s=config.miss_ttl_s, clock=clock)

    @property
    def num_slots(self) -> int:
        return self.host.num_slots

    def __len__(self) -> int:
        return len(self.host)

    # ---- lookup and promotion ----------------------------------------------------------

    def lookup(self, keys: Iterable[ChunkKey]) -> list[ChunkState]:
        """Host states, with chunks that may be below reported WRITING while promoted."""
        ks = checked_keys(keys)
        with self.lock:
            states = self.host.lookup_checked(ks)
            if not self.lower or ChunkState.ABSENT not in states:
                return states
            now = self._clock()
            fetch = [k for k, s in zip(ks, states, strict=True)
                     if s is ChunkState.ABSENT and not self._in_flight(k)
                     and self._worth_fetching(k, now)]
            if fetch:
                self._fetching.update(fetch)
                self._fetch_from(0, _Fetch(fetch, ks))
                states = self.host.lookup_checked(ks)  # synchronous tiers have promoted
            return [ChunkState.WRITING if s is ChunkState.ABSENT and self._in_flight(k) else s
                    for k, s in zip(ks, states, strict=True)]

    def _in_flight(self, key: ChunkKey) -> bool:
        """Being promoted, or evicted and still on its way down."""
        return key in self._fetching or self._down.going_down(key)

    def _worth_fetching(self, key: ChunkKey, now: float) -> bool:
        return (self._absent_until.get(key, now) <= now
                and any(t.might_hold(key) for t in self.lower))

    def _fetch_from(self, level: int, fetch: _Fetch) -> None:
        """Ask ``lower[level]`` for what is still sought (on its workers), then the next
        tier or install."""
        tier = self.lower[level]
        want = [k for k in fetch.rest() if tier.might_hold(k)]
        if not want:
            self._after_fetch(level, fetch)
            return
        self._background.track(tier.get_async(want), lambda f: self._fetched(level, fetch, f))

    def _fetched(self, level: int, fetch: _Fetch,
                 future: Future[dict[ChunkKey, memoryview]]) -> None:
        got = {} if future.exception() else future.result()
        fetch.found.update((k, (level, v)) for k, v in got.items())
        self._after_fetch(level, fetch)

    def _after_fetch(self, level: int, fetch: _Fetch) -> None:
        if level + 1 < len(self.lower) and fetch.rest():
            self._fetch_from(level + 1, fetch)
        else:
            self._install(fetch)

    def _install(self, fetch: _Fetch) -> None:
        """Store the found chunks into host slots; remember the rest as absent."""
        installed: list[ChunkKey] = []
        try:
            if fetch.found:
                installed = self._take_up(fetch)
            self._down.send()
        finally:
            with self.lock:
                self._fetching.difference_update(fetch.keys)
                until = self._clock() + self._miss_ttl_s
                up = set(installed)
                self._absent_until.update((k, until) for k in fetch.keys if k not in up)
                self._prune_absent()

    def _take_up(self, fetch: _Fetch) -> list[ChunkKey]:
        """Reserve host slots for the found chunks, the lookup's chunks in host memory
        protected (module docstring), write and publish them; the keys now in host memory."""
        found = fetch.found
        with self.lock:
            asked = fetch.asked
            held = [k for k, s in zip(asked, self.host.lookup(asked), strict=True)
                    if s is not ChunkState.ABSENT]
            handle = self.host.prepare_store(held + list(found), promote=True)
        if not isinstance(handle, StoreHandle):
            return []
        for k, slot in zip(handle.keys, handle.slots, strict=True):
            self.backend.write(slot, found[k][1])
        self.host.complete_store(handle, ok=True)
        self._promoted(handle.keys, found)
        return [k for k in found if k in handle.keys or k in handle.skipped]

    def _promoted(
        self, keys: Sequence[ChunkKey], found: dict[ChunkKey, tuple[int, memoryview]]
    ) -> None:
        """Count each promoted chunk to its tier and tell the watchers; under exclusive
        placement, take it out of that tier (before host evictions are written down)."""
        by_tier: dict[int, list[ChunkKey]] = {}
        for k in keys:
            by_tier.setdefault(found[k][0], []).append(k)
        for level, ks in by_tier.items():
            tier = self.lower[level]
            tier.stats.add(promoted=len(ks))
            for watch in self._watchers:
                for k in ks:
                    watch(k, tier.name)
            if self.placement == "exclusive":
                self._background.track(tier.remove_async(ks))

    def watch_promotions(self, callback: Promoted) -> None:
        """Call ``callback(key, tier name)`` for every chunk promoted into host memory
        from now on, on the thread that installs it (for synchronous tiers, within
        ``lookup``)."""
        with self.lock:
            self._watchers.append(callback)

    def _prune_absent(self) -> None:
        if len(self._absent_until) > 65536:
            now = self._clock()
            self._absent_until = {k: t for k, t in self._absent_until.items() if t > now}

    # ---- the paired protocol, on host memory -------------------------------------------

    def prepare_load(self, keys: Iterable[ChunkKey]) -> LoadHandle:
        """Pin host-resident ``keys`` (see ``ChunkStore.prepare_load``)."""
        handle = self.host.prepare_load(keys)
        if self._host_watchers:
            self._started[handle.id] = time.perf_counter()
        self._host_hits += len(handle.keys)
        return handle

    def complete_load(self, handle: LoadHandle) -> None:
        self.host.complete_load(handle)
        if (start := self._started.pop(handle.id, None)) is not None:
            self.host_stats.add(reads=1, read_seconds=time.perf_counter() - start)

    def touch(self, keys: Iterable[ChunkKey]) -> int:
        return self.host.touch(keys)

    def prepare_store(
        self, keys: Iterable[ChunkKey], parents: Sequence[ChunkKey | None] | None = None
    ) -> StoreHandle | StoreRefusal:
        """Reserve host slots (evictions are written down under write-back); ``parents`` is
        the host policy's prefix hint (``ChunkStore.prepare_store``)."""
        ks = keys if isinstance(keys, list) else list(keys)
        try:
            result = self.host.prepare_store(ks, parents)
        finally:
            self._down.send()
        if not isinstance(result, StoreHandle):
            refused = sum(s is ChunkState.ABSENT for s in self.host.lookup(set(ks)))
            self.host_stats.add(refused=refused)
        elif self._host_watchers:
            self._started[result.id] = time.perf_counter()
        return result

    def complete_store(self, handle: StoreHandle, ok: bool) -> None:
        """Publish on the host (and write through to every tier, under write-through); a
        failed store's slots are cleared as they are freed, like evicted ones."""
        try:
            with self.lock:
                self.host.complete_store(handle, ok)
                for slot in () if ok else handle.slots:
                    self._down.clear(slot)
        finally:
            self._down.send()
        start = self._started.pop(handle.id, None)
        if not ok:
            self.host_stats.add(errors=1)
        elif start is not None:
            self.host_stats.add(writes=1, write_seconds=time.perf_counter() - start)

    def remove(self, keys: Iterable[ChunkKey]) -> list[ChunkKey]:
        """Drop ready, unpinned ``keys`` from host memory and from every lower tier."""
        gone = self.host.remove(keys)
        with self.lock:
            for tier in self.lower if gone else ():
                self._background.track(tier.remove_async(gone))
        return gone

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Host-tier events; a promotion shows as STORED."""
        return self.host.subscribe(callback)

    def subscribe_tiers(self, callback: Subscriber) -> Callable[[], None]:
        """Events of the host and of every lower tier that publishes them
        (``lower.EventSource``: disk, metadata tiers), each with its tier's name in
        ``StoreEvent.tier``; a tier's events arrive on the thread that changed it. Redis
        publishes none: its evictions and expiries happen in the server, unseen."""
        return unsubscribe_all([source.subscribe(callback) for _, source in self._sources()])

    def subscribe_tier_batches(self, callback: TierBatchSubscriber) -> Callable[[], None]:
        """``subscribe_tiers``'s events, a call per change: ``callback(tier, kind, keys, slots)``"""
        return subscribe_named(self._sources(), callback)

    def _sources(self) -> list[tuple[str, EventSource]]:
        return [("host", self.host), *((t.name, t) for t in self.lower
                                       if isinstance(t, EventSource))]

    def _on_host_batch(self, kind: EventKind, keys: Sequence[ChunkKey], slots: Sequence[int]
                       ) -> None:
        """Host subscriber, under the host lock: copy bytes that must go down now, while the
        slots still hold them (module docstring); zero the slots a change freed."""
        down, clear = kind is self._due and bool(self.lower), kind is not _STORED and self._zeroed
        for key, slot in zip(keys, slots, strict=True) if down or clear else ():
            if down and key not in self._fetching:
                self._down.copy(key, slot)
                self._absent_until.pop(key, None)  # going down: worth fetching again
            if clear:
                self._down.clear(slot)  # freed: none of its bytes may go down with the next

    # ---- observing, waiting, closing ---------------------------------------------------

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per tier, fastest first: hits, promotions, bytes, errors, latency."""
        host = self.host_stats.snapshot()
        for name, count in self._host_events.fields().items():
            host[name] += count
        host["hits"] += self._host_hits
        return {"host": host, **{t.name: t.stats.snapshot() for t in self.lower}}

    def flush(self, timeout_s: float | None = 30.0) -> bool:
        """Wait until no promotion or write-down is in flight; False on timeout."""
        return self._background.flush(timeout_s)

    def check_invariants(self) -> None:
        """The host store's and every tier's invariants, and nothing left unsent."""
        with self.lock:
            self.host.check_invariants()
            if unsent := self._down.unsent():
                raise AssertionError(f"{unsent} chunks copied but not sent down")
        for tier in self.lower:
            tier.check_invariants()

    def close(self) -> None:
        """Wait for background work, then close every lower tier."""
        self.flush(timeout_s=None)
        for tier in self.lower:
            tier.close()

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
