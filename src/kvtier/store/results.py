"""The small values the store protocol hands out (states, handles, refusals, events), and
the one check every key passes on the way in (`checked_keys`).

Every ``prepare_*`` call returns a handle that its ``complete_*`` takes back; a handle is
an immutable record of what was prepared (the keys, and the slots they occupy), so the data
plane can copy bytes to or from ``backend.view(slot)`` between the two calls.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, TypeVar, cast

from kvtier.keys import DIGEST_SIZE, TAG_SIZE, ChunkKey

_T = TypeVar("_T")
KEY_BYTES: Final = TAG_SIZE + DIGEST_SIZE
"""Length of a ``ChunkKey``: an 8-byte group tag and a 32-byte prefix digest."""


def checked_keys(keys: Iterable[object]) -> list[ChunkKey]:
    """``keys`` as a list, each a 40-byte ``bytes`` ``ChunkKey``; ValueError otherwise.

    Typed as taking any objects, so that the compiled build (mypyc checks the types it is
    told) reaches this check and raises the same ValueError as the pure one."""
    if isinstance(keys, (bytes, bytearray, str)):
        raise ValueError("pass a list of ChunkKeys, not a single key or string")
    out: list[object] = keys if type(keys) is list else list(keys)
    # a plain loop: faster than set(map(type, ...)) and set(map(len, ...)); compiled, the
    # type is a pointer compare and the length (of bytes, once known) is read in place
    for k in out:
        if type(k) is not bytes or len(cast(bytes, k)) != KEY_BYTES:
            raise ValueError(
                f"a chunk key must be {KEY_BYTES} bytes (a ChunkKey from KeyChain.key), "
                f"got {type(k).__name__} {k!r:.60}"
            )
    return cast("list[ChunkKey]", out)


class ChunkState(enum.Enum):
    """What ``lookup`` reports for one key."""

    ABSENT = "absent"
    """Not in the store (never stored, evicted, removed, or its store failed)."""
    WRITING = "writing"
    """A slot is reserved and a store is in progress; not readable yet."""
    READY = "ready"
    """Readable; may be evicted."""
    PINNED = "pinned"
    """Readable and held by one or more loads in progress; never evicted."""

    @property
    def readable(self) -> bool:
        """READY or PINNED: ``prepare_load`` accepts it."""
        return self is ChunkState.READY or self is ChunkState.PINNED


class LoadHandle(NamedTuple):
    """Loads in progress: ``keys[i]`` is pinned and readable in ``slots[i]``.

    A named tuple: immutable, and cheap to build (a frozen dataclass costs four times as
    much, once per ``prepare_*`` call). The store knows a live handle by identity, so an
    equal copy is not one of its handles.
    """

    id: int
    keys: tuple[ChunkKey, ...]
    slots: tuple[int, ...]


class StoreHandle(NamedTuple):
    """A store in progress: write ``keys[i]`` into ``slots[i]``, then ``complete_store``.

    ``skipped`` are offered keys that were not reserved because they are already ready or
    being written by another store; they need no bytes from this caller. Immutable and
    known by identity, as ``LoadHandle``.
    """

    id: int
    keys: tuple[ChunkKey, ...]
    slots: tuple[int, ...]
    skipped: tuple[ChunkKey, ...]
    parents: tuple[ChunkKey | None, ...] = ()
    """The hinted parent of each of ``keys`` (``prepare_store(parents=...)``), or ``()``."""
    declined: tuple[ChunkKey, ...] = ()
    """Offered absent keys that admission did not admit (``kvtier.store.admission``): not
    stored, and not reserved; a later lookup finds them absent."""


@dataclass(frozen=True, slots=True)
class StoreRefusal:
    """``prepare_store`` could not reserve slots; nothing changed.

    ``retryable``: the store could accept this later, once loads complete (pins drop) or
    stores finish; ``False`` when the request needs more slots than the store has at all.
    """

    reason: str
    needed: int
    """Slots the request needed beyond the free ones."""
    evictable: int
    """Ready, unpinned, unprotected chunks there were to evict."""
    retryable: bool


class EventKind(enum.Enum):
    STORED = "stored"
    """A store completed: the chunk became readable."""
    EVICTED = "evicted"
    """The eviction loop dropped a ready chunk to make room."""
    REMOVED = "removed"
    """``remove`` dropped a ready chunk on request."""


@dataclass(frozen=True, slots=True)
class StoreEvent:
    kind: EventKind
    key: ChunkKey
    slot: int
    tier: str = "host"
    """The tier the chunk was stored in or dropped from (``host``, ``disk``, ...)."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled through the constructor: vLLM sends it between processes, and the
        compiled build's frozen classes refuse the default pickle's attribute writes."""
        return (StoreEvent, (self.kind, self.key, self.slot, self.tier))


Subscriber = Callable[[StoreEvent], None]
BatchSubscriber = Callable[[EventKind, Sequence[ChunkKey], Sequence[int]], None]
"""Called once per change of a store with its kind and every chunk it changed: the keys
and their slots, in event order (``ChunkStore.subscribe_batches``). The sequences are the
store's own: read them during the call, never change or keep them."""
TierBatchSubscriber = Callable[[str, EventKind, Sequence[ChunkKey], Sequence[int]], None]
"""A ``BatchSubscriber`` told the tier's name first (``TieredStore.subscribe_tier_batches``)."""


class Subscribers:
    """A store's event subscribers: per event (``Subscriber``) and per change
    (``BatchSubscriber``), added and removed under the store's ``lock``."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._each: list[Subscriber] = []
        self._batches: list[BatchSubscriber] = []

    def add_each(self, callback: Subscriber) -> Callable[[], None]:
        return self._add(self._each, callback)

    def add_batches(self, callback: BatchSubscriber) -> Callable[[], None]:
        return self._add(self._batches, callback)

    def _add(self, subscribers: list[_T], callback: _T) -> Callable[[], None]:
        with self._lock:
            subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in subscribers:
                    subscribers.remove(callback)

        return unsubscribe

    def emit(self, kind: EventKind, keys: Sequence[ChunkKey], slots: Sequence[int]) -> None:
        """One change, under the lock: to each batch subscriber, then event by event to
        each per-event one (no event object made without one)."""
        if not keys:
            return
        for batch in list(self._batches) if self._batches else ():
            batch(kind, keys, slots)
        if not self._each:
            return
        each = list(self._each)
        for k, slot in zip(keys, slots, strict=True):
            event = StoreEvent(kind, k, slot)
            for callback in each:
                callback(event)


class EventLog:
    """A subscriber that keeps events until drained.

    >>> log = EventLog()
    >>> log(StoreEvent(EventKind.STORED, ChunkKey(bytes(40)), 0))
    >>> [e.kind.value for e in log.drain()], log.drain()
    (['stored'], [])
    """

    def __init__(self) -> None:
        self._events: list[StoreEvent] = []

    def __call__(self, event: StoreEvent) -> None:
        self._events.append(event)

    def drain(self) -> list[StoreEvent]:
        """Every event since the last drain, oldest first."""
        events, self._events = self._events, []
        return events


class EventCounts:
    """Chunks a store stored and evicted, counted by subscribing to its events: one
    increment per event, under the store's own lock (so no lock of its own). Here, beside
    the events, so that the serving build compiles it: a tiered store counts every chunk
    its host stores and evicts (``kvtier.tiers.tiered``).

    >>> counts = EventCounts()
    >>> counts(StoreEvent(EventKind.STORED, ChunkKey(bytes(40)), 0)); counts.fields()
    {'stored': 1, 'evicted': 0}
    >>> counts.batch(EventKind.EVICTED, [ChunkKey(bytes(40))] * 2, [0, 1]); counts.fields()
    {'stored': 1, 'evicted': 2}
    """

    __slots__ = ("_evicted", "_stored")

    def __init__(self) -> None:
        self._stored = self._evicted = 0

    def __call__(self, event: StoreEvent) -> None:
        self.batch(event.kind, (event.key,), (event.slot,))

    def batch(self, kind: EventKind, keys: Sequence[ChunkKey], slots: Sequence[int]) -> None:
        """Count a batch of events (a ``BatchSubscriber``)."""
        if kind is EventKind.STORED:  # compared by identity: an enum's hash is a Python call
            self._stored += len(keys)
        elif kind is EventKind.EVICTED:
            self._evicted += len(keys)

    def fields(self) -> dict[str, int]:
        """As ``TierStats`` fields (a removal on request counts nowhere)."""
        return {"stored": self._stored, "evicted": self._evicted}


class HandleError(ValueError):
    """A ``complete_*`` got a handle that is not live here: already completed, from another
    store, or of the other kind. Nothing changed."""


class ChunkNotReadyError(LookupError):
    """``prepare_load`` asked for keys that are not readable; nothing was pinned."""
