"""The chunk store manager: the paired protocol, chunk states, accounting, eviction.

Protocol (after vLLM's offloading manager). Each step is separate because the bytes move
asynchronously, on the data plane, between a ``prepare_*`` and its ``complete_*``:

* ``lookup(keys)``: a ``ChunkState`` per key; changes nothing.
* ``prepare_load(keys) -> LoadHandle``: pins every key (it cannot be evicted while the data
  plane reads its slot). Every key must be readable, else
  ``ChunkNotReadyError`` and nothing is pinned: the planner loads only what ``lookup`` saw
  ready. To make lookup and load atomic against other threads, hold ``store.lock``.
* ``complete_load(handle)``: unpins, and counts the load as an access of its keys (the
  policy sees it then, not at the pin: a pinned chunk cannot be evicted, so the recency a
  load gives it matters only from its unpin on, and a lookup, which pins, stays short).
* ``prepare_store(keys) -> StoreHandle | StoreRefusal``: reserves a slot for each key that
  is absent (keys already ready or being written are skipped and reported), evicting ready,
  unpinned chunks if needed. The offered keys are protected: never evicted to make room for
  their own request. When there is not enough to evict it returns a ``StoreRefusal``
  (never raises for a full store) and nothing changes. With admission
  (``ChunkStore(..., admission=Admission(after=N))``, ``kvtier.store.admission``) an
  absent key is reserved only at its N-th offer within the window; the others are
  ``declined`` in the handle: not stored, as if there were no room.
* ``complete_store(handle, ok)``: on success the chunks become ready (event STORED); on
  failure their slots are freed and they were never visible.
* ``touch(keys)``: refreshes recency of ready keys (a hit that needs no load).
* ``remove(keys)``: drops ready, unpinned keys (event REMOVED).
* ``subscribe(callback)``: events (STORED, EVICTED, REMOVED) for observers, one object a
  chunk; ``subscribe_batches(callback)``: the same, one call per change with all its chunks.

A ``complete_*`` given a stale, foreign, or already completed handle raises
``HandleError`` and changes nothing.

States: absent -> writing -> ready <-> pinned -> (evicted or removed) -> absent. The manager
alone owns the accounting (two dicts and a count, changed only by the ``_reserve`` /
``_publish`` / ``_abort`` / ``_drop`` helpers; pins counted in ``kvtier.store.pins``) and
the one eviction loop (``_make_room``); the policy only picks victims.
``check_invariants()`` recomputes everything from scratch (``kvtier.store.checks``).

Threads: every public method holds ``self.lock``, one ``threading.RLock``; the engine's
scheduler thread and transfer-completion threads may call concurrently. Subscribers run
under the lock, in event order (a change's batch subscribers before its per-event ones):
keep them short and do not block in them.

A store is metadata-only (``ChunkStore(num_slots)``: slot numbers, no bytes; what the
replay simulator uses) or backed by a tier (``ChunkStore(backend=HostSlab(...))``, or
``kvtier.tiers.host.host_store(layout, capacity_bytes)``), whose slots the handles name.

>>> store = ChunkStore(2)
>>> a, b, c = (ChunkKey(bytes([i]) * 40) for i in range(3))
>>> h = store.prepare_store([a, b]); store.complete_store(h, ok=True)
>>> [s.value for s in store.lookup([a, c])]
['ready', 'absent']
>>> load = store.prepare_load([a])
>>> store.prepare_store([c]).keys == (c,)   # b is evicted to make room; a is pinned
True
>>> [s.value for s in store.lookup([a, b, c])]
['pinned', 'absent', 'writing']
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Final, NoReturn, cast

from mypy_extensions import mypyc_attr

from kvtier.keys import ChunkKey
from kvtier.store.admission import Admission
from kvtier.store.backend import SlotAllocator, SlotBackend
from kvtier.store.checks import (
    check_handles,
    check_policy,
    check_slots,
    parent_hint,
    parents_of,
    resolve_num_slots,
    resolve_policy,
    take_handle,
)
from kvtier.store.pins import PinCounts
from kvtier.store.policies import Policy
from kvtier.store.results import (
    BatchSubscriber,
    ChunkNotReadyError,
    ChunkState,
    EventKind,
    LoadHandle,
    StoreHandle,
    StoreRefusal,
    Subscriber,
    Subscribers,
    checked_keys,
)

# Final: the compiled build reads them as C statics, not from the module's dict (per key)
_ABSENT: Final = ChunkState.ABSENT
_WRITING: Final = ChunkState.WRITING
_READY: Final = ChunkState.READY
_PINNED: Final = ChunkState.PINNED
_STORED: Final = EventKind.STORED
_EVICTED: Final = EventKind.EVICTED
_REMOVED: Final = EventKind.REMOVED


@mypyc_attr(allow_interpreted_subclasses=True)
class ChunkStore:
    """Chunks in ``num_slots`` slots, evicted by ``policy`` (see the module docstring).

    Give either ``num_slots`` (metadata-only) or ``backend`` (slots from a tier). ``policy``
    is a registered name (``"lru"``, ``"arc"``, ``"s3fifo"``) or a ``Policy`` built for
    the same number of slots (``Belady(num_slots, future)``). ``admission``: when a new
    chunk is stored (``kvtier.store.admission``; default: at its first offer).
    """

    def __init__(
        self,
        num_slots: int | None = None,
        *,
        backend: SlotBackend | None = None,
        policy: str | Policy = "lru",
        admission: Admission | None = None,
    ) -> None:
        self.backend = backend
        self.num_slots = resolve_num_slots(num_slots, backend)
        self.policy = resolve_policy(policy, self.num_slots)
        if admission is not None and not isinstance(admission, Admission):
            raise ValueError(f"ChunkStore: admission must be an Admission, got {admission!r}")
        self.admission = admission or Admission()
        self._offers = self.admission.filter(self.num_slots)  # None: every offer admitted
        self.lock = threading.RLock()
        """The one lock: every public method holds it; callers may too (it is reentrant)."""
        self._alloc = SlotAllocator(self.num_slots)
        # every key holding a slot: ready -> its slot, writing (a store in progress) -> ~slot,
        # so one lookup tells both (a negative value is never readable)
        self._slots: dict[ChunkKey, int] = {}
        self._num_writing = 0
        self._pin_counts = PinCounts()  # live loads per pinned key
        self._loads: dict[int, LoadHandle] = {}
        self._stores: dict[int, StoreHandle] = {}
        self._ids = itertools.count(1)
        self._events = Subscribers(self.lock)

    # ---- queries -----------------------------------------------------------------------

    def lookup(self, keys: Iterable[ChunkKey]) -> list[ChunkState]:
        """The state of each key, in order. Changes nothing (not an access)."""
        return self.lookup_checked(checked_keys(keys))

    def lookup_checked(self, ks: list[ChunkKey]) -> list[ChunkState]:
        """``lookup`` of keys a store above this one has already passed through
        ``checked_keys`` (a list of ``ChunkKey``): not checked again."""
        with self.lock:
            slots = self._slots
            if not self._num_writing and not self._loads:  # nothing in flight: absent or ready
                return [_READY if k in slots else _ABSENT for k in ks]
            pins, get = self._pinned(), slots.get
            return [
                _ABSENT if (v := get(k)) is None else
                _WRITING if v < 0 else _PINNED if k in pins else _READY
                for k in ks
            ]

    @property
    def num_free(self) -> int:
        return self._alloc.num_free

    @property
    def num_ready(self) -> int:
        """Readable chunks, pinned or not."""
        return len(self._slots) - self._num_writing

    @property
    def num_writing(self) -> int:
        return self._num_writing

    @property
    def num_pinned(self) -> int:
        """Distinct chunks held by at least one load."""
        with self.lock:
            return len(self._pinned())

    def __len__(self) -> int:
        return self.num_ready

    # ---- loads -------------------------------------------------------------------------

    def prepare_load(self, keys: Iterable[ChunkKey]) -> LoadHandle:
        """Pin readable ``keys`` for reading; ``ChunkNotReadyError`` (nothing pinned) if any
        is absent or still being written."""
        ks = checked_keys(keys)
        with self.lock:
            slots = self._slots
            try:
                held = tuple(map(slots.__getitem__, ks))
            except KeyError:
                self._refuse_load(ks)
            if self._num_writing and held and min(held) < 0:  # a key is being written
                self._refuse_load(ks)
            hid = next(self._ids)
            handle = self._loads[hid] = tuple.__new__(LoadHandle, (hid, tuple(ks), held))
            self._pin_counts.pin(handle.keys, self._loads)
            return handle

    def _refuse_load(self, ks: list[ChunkKey]) -> NoReturn:
        states = self.lookup(ks)
        bad = [s.value for s in states if not s.readable]
        raise ChunkNotReadyError(
            f"prepare_load: {len(bad)} of {len(ks)} keys are not readable ({bad[:3]}...); "
            "load only keys that lookup reported ready, under store.lock if other threads evict"
        )

    def complete_load(self, handle: LoadHandle) -> None:
        """Release the pins of ``handle``; ``HandleError`` if it is not live here."""
        with self.lock:
            take_handle(self._loads, handle, "load")
            self._pin_counts.unpin(handle.keys, self._loads)
            self.policy.on_access(handle.keys)

    def touch(self, keys: Iterable[ChunkKey]) -> int:
        """Count a use of each ready key (absent or writing keys are ignored); how many."""
        ks = checked_keys(keys)
        with self.lock:
            get = self._slots.get
            ready = [k for k in ks if get(k, -1) >= 0]
            self.policy.on_access(ready)
            return len(ready)

    # ---- stores ------------------------------------------------------------------------

    def prepare_store(
        self, keys: Iterable[ChunkKey], parents: Sequence[ChunkKey | None] | None = None,
        *, promote: bool = False, now: bool = False,
    ) -> StoreHandle | StoreRefusal:
        """Reserve slots for the absent ``keys`` that admission admits, evicting if needed
        (module docstring). ``now``: and ``complete_store(handle, ok=True)`` within the
        call (a caller with no bytes to move: the replay), the handle already completed.

        ``parents`` (optional, one per key): the key of the chunk before each key in the
        same request and group, or None for a first chunk; a hint that prefix-aware
        policies use to evict leaves before their ancestors (``on_insert_with_parents``).
        ``promote``: the keys come from a lower tier of this store's hierarchy, admitted
        when first stored: admission does not filter (nor count) them.
        """
        ks = given = checked_keys(keys)
        hint = parent_hint(ks, parents)
        if len(ks) > 1 and len(set(ks)) != len(ks):  # a set: half the cost of a dict
            ks = list(dict.fromkeys(ks))  # a key offered twice counts once, in first place
        with self.lock:
            slots = self._slots
            skipped: tuple[ChunkKey, ...] = ()
            if slots.keys().isdisjoint(ks):  # the common case, checked at C speed
                new = ks
            else:  # one pass: each key looked up once
                new = []
                held: list[ChunkKey] = []
                for k in ks:
                    (held if k in slots else new).append(k)
                skipped = tuple(held)
            offers = None if promote else self._offers
            declined: list[ChunkKey]
            offered, declined = new, []  # declined: offered keys admission holds back
            fps = offers.fingerprints(new) if offers is not None else []
            if offers is not None:
                new, declined = offers.split(new, fps)
            if len(new) > self._alloc.num_free:
                refusal = self._make_room(len(new), skipped)
                if refusal is not None:
                    return refusal
            if offers is not None:
                offers.record(offered, fps)
            hid = next(self._ids)
            parents = (parents_of(given, hint, new, len(ks) == len(given)) if hint and new
                       else ())
            # (a named tuple's own constructor is an interpreted function: tuple.__new__
            # builds the same handle at C speed, once a store and once a load)
            handle = tuple.__new__(StoreHandle, (
                hid, tuple(new), self._reserve(new, now), skipped, parents, tuple(declined),
            ))
            if now:  # complete_store's publishing, the slots written ready by _reserve
                self.policy.on_insert_with_parents(handle.keys, handle.parents)
                self._events.emit(_STORED, handle.keys, handle.slots)
            else:
                self._stores[hid] = handle
            return handle

    def complete_store(self, handle: StoreHandle, ok: bool) -> None:
        """Publish ``handle``'s chunks (``ok``) or free their slots; ``HandleError`` if the
        handle is not live here."""
        with self.lock:
            take_handle(self._stores, handle, "store")
            if ok:
                self._publish(handle)
                self._events.emit(_STORED, handle.keys, handle.slots)
            else:
                self._abort(handle)

    def remove(self, keys: Iterable[ChunkKey]) -> list[ChunkKey]:
        """Drop the ready, unpinned ``keys``; the ones removed (others are left alone)."""
        ks = checked_keys(keys)
        with self.lock:
            gone = [k for k in dict.fromkeys(ks) if self._removable(k)]
            self.policy.on_remove(gone)
            self._events.emit(_REMOVED, gone, self._drop(gone))
            return gone

    def _removable(self, k: ChunkKey) -> bool:
        return self._slots.get(k, -1) >= 0 and k not in self._pinned()

    # ---- the eviction loop -------------------------------------------------------------

    def _make_room(self, num_new: int, offered: Collection[ChunkKey]) -> StoreRefusal | None:
        """Evict until ``num_new`` slots are free, or refuse and change nothing."""
        short = num_new - self._alloc.num_free
        if num_new > self.num_slots:
            return StoreRefusal(
                f"the request needs {num_new} new slots but the store has only "
                f"{self.num_slots}; store fewer chunks per request or add capacity",
                short, 0, retryable=False,
            )
        pinned = self._pinned().keys()
        protected = pinned | offered if offered else pinned
        victims = cast("list[ChunkKey] | None", self.policy.victims(short, protected))
        if victims is None:
            evictable = self.policy.num_unprotected(protected)
            return StoreRefusal(
                f"needs {short} more slots, but only {evictable} ready chunks are neither "
                f"pinned nor offered ({self.num_writing} writing, {self.num_pinned} pinned); "
                "retry after loads or stores complete",
                short, evictable, retryable=True,
            )
        self._events.emit(_EVICTED, victims, self._drop(victims))
        return None

    # ---- the only places counts change -------------------------------------------------

    def _reserve(self, keys: list[ChunkKey], ready: bool = False) -> tuple[int, ...]:
        """absent -> writing: a slot each (``ready``: absent -> ready, published at once)."""
        slots = self._alloc.allocate_many(len(keys))
        held = self._slots
        # one slot per key; a bare zip, which mypyc compiles into a loop (not with strict=)
        for k, slot in zip(keys, slots):  # noqa: B905
            held[k] = slot if ready else ~slot
        if not ready:
            self._num_writing += len(keys)
        return tuple(slots)

    def _publish(self, handle: StoreHandle) -> None:
        """writing -> ready."""
        held = self._slots
        for k, slot in zip(handle.keys, handle.slots):  # noqa: B905  (as in _reserve)
            held[k] = slot
        self._num_writing -= len(handle.keys)
        self.policy.on_insert_with_parents(handle.keys, handle.parents)

    def _abort(self, handle: StoreHandle) -> None:
        """writing -> absent (a failed store): never visible."""
        slots = self._slots
        for k in handle.keys:
            del slots[k]
        self._alloc.free_many(list(handle.slots))
        self._num_writing -= len(handle.keys)

    def _drop(self, keys: Sequence[ChunkKey]) -> list[int]:
        """Free the slots of ready ``keys`` (already gone from the policy)."""
        freed = list(map(self._slots.pop, keys))
        self._alloc.free_many(freed)
        return freed

    def _pinned(self) -> dict[ChunkKey, int]:
        """Live loads per pinned key (``kvtier.store.pins``)."""
        return self._pin_counts.counts(self._loads)

    # ---- events ------------------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(event)`` for every event from now on; returns an unsubscribe."""
        return self._events.add_each(callback)

    def subscribe_batches(self, callback: BatchSubscriber) -> Callable[[], None]:
        """Call ``callback(kind, keys, slots)`` once per change from now on, with every
        chunk it stored, evicted or removed (``results.BatchSubscriber``): the events
        ``subscribe`` gives, without an object per chunk, for subscribers that count or
        copy on every store (a tiered store, the replay). Returns an unsubscribe."""
        return self._events.add_batches(callback)

    # ---- checks ------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Recompute every count from scratch; AssertionError on any disagreement."""
        with self.lock:
            pinned = self._pinned()
            check_slots(self._alloc.free_slots(), self._slots, self.num_slots,
                        self._num_writing, pinned)
            check_handles(self._slots, self._stores, self._loads, pinned)
            check_policy(self.policy, self._slots)
