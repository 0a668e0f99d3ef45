"""What a tier below host memory offers the hierarchy, its counters and its workers.

A lower tier (``DiskTier``, ``RedisTier``) holds records (``kvtier.tiers.records.format``) by key.
Its blocking calls (``get``, ``put``, ``remove``) may take milliseconds, so the hierarchy
calls their ``*_async`` twins, which run on the tier's own small worker pool and return a
``concurrent.futures.Future``; the engine's scheduler thread never waits on disk or network.
The pool starts on first use (not in a constructor), and ``close()`` stops it.

``might_hold(key)`` answers from memory only (the disk tier's index; for Redis, whether the
server is currently believed up), so that ``TieredStore.lookup`` can decide, without I/O,
whether a fetch is worth starting.

>>> stats = TierStats("disk")
>>> stats.add(hits=2, bytes_read=4096, reads=1, read_seconds=0.002)
>>> snap = stats.snapshot(); snap["hits"], snap["read_mb_s"], snap["mean_read_ms"]
(2, 2.048, 2.0)
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

from kvtier.keys import ChunkKey
from kvtier.store.backend import BytesLike
from kvtier.store.results import BatchSubscriber, StoreEvent, Subscriber, TierBatchSubscriber
from kvtier.store.results import EventCounts as EventCounts  # moved there (compiled)

if TYPE_CHECKING:
    from kvtier.store.manager import ChunkStore

T = TypeVar("T")
R = TypeVar("R")
Item = tuple[ChunkKey, BytesLike]
"""A chunk going down: its key and its payload."""
Demote = Callable[[ChunkKey, bytes], None]
"""Called with a chunk a tier evicted (and its payload), to write it one tier down."""
LatencyWatcher = Callable[[str, str, float], None]
"""Called with a tier's name, ``"read"`` or ``"write"``, and one call's seconds."""


@dataclass
class TierStats:
    """Counters of one tier; ``add`` is the only place they change (under a lock)."""

    name: str
    hits: int = 0
    """Chunks found and verified."""
    misses: int = 0
    """Chunks asked for and not held."""
    corrupt: int = 0
    """Chunks that failed verification (checksum, length, key, geometry or seal): dropped."""
    foreign: int = 0
    """Entries found where the tier keeps chunks that it did not write: left untouched."""
    errors: int = 0
    """Failed calls (I/O errors, connection errors, timeouts)."""
    promoted: int = 0
    """Chunks this tier handed up to host memory (a lookup's hit here)."""
    skipped: int = 0
    """Calls not attempted because the tier is backing off after errors."""
    stored: int = 0
    """Chunks written."""
    refused: int = 0
    """Chunks not written (no room, disk full, server down)."""
    evicted: int = 0
    """Chunks the tier dropped to make room."""
    bytes_read: int = 0
    bytes_written: int = 0
    reads: int = 0
    """Calls of ``get`` that reached the medium."""
    read_seconds: float = 0.0
    writes: int = 0
    """Calls of ``put`` that reached the medium."""
    write_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _watchers: list[LatencyWatcher] = field(default_factory=list, repr=False, compare=False)
    _changes: int = field(default=0, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        """Add each delta to its counter; a call counted in ``reads`` (``writes``) with its
        ``read_seconds`` (``write_seconds``) is one latency observation for the watchers."""
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)
            self._changes += 1
        if self._watchers:
            for op in ("read", "write"):
                if deltas.get(op + "s"):
                    for watch in self._watchers:
                        watch(self.name, op, deltas.get(op + "_seconds", 0.0))

    @property
    def changes(self) -> int:
        """Calls of ``add`` so far: unchanged, no counter moved (read without the lock)."""
        return self._changes

    @property
    def watched(self) -> bool:
        """Whether a latency watcher is attached (a tier may time its calls only then)."""
        return bool(self._watchers)

    def watch(self, callback: LatencyWatcher) -> None:
        """Call ``callback(tier name, "read" or "write", seconds)`` for every timed call from
        now on (``kvtier.metrics`` builds its latency histograms from these)."""
        with self._lock:
            self._watchers.append(callback)

    def snapshot(self) -> dict[str, Any]:
        """Every counter, plus mean latencies (ms) and bandwidths (MB/s) derived from them."""
        with self._lock:
            out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)
                                   if not f.name.startswith("_")}
        out["mean_read_ms"] = _ratio(out["read_seconds"] * 1e3, out["reads"])
        out["mean_write_ms"] = _ratio(out["write_seconds"] * 1e3, out["writes"])
        out["read_mb_s"] = _ratio(out["bytes_read"] / 1e6, out["read_seconds"])
        out["write_mb_s"] = _ratio(out["bytes_written"] / 1e6, out["write_seconds"])
        return out


def copied_into(got: dict[ChunkKey, memoryview], keys: Sequence[ChunkKey],
                views: Sequence[memoryview]) -> dict[ChunkKey, memoryview]:
    """``got``'s payloads copied into their keys' ``views``: a sealed tier's ``get_into``
    (its payloads are opened into new bytes, so they are copied anyway)."""
    out = {}
    for k, view in zip(keys, views, strict=True):
        if k in got:
            out[k] = view[: got[k].nbytes]
            out[k][:] = got[k]
    return out


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


@runtime_checkable
class LowerTier(Protocol):
    """A tier below host memory (see the module docstring)."""

    name: str
    stats: TierStats

    def might_hold(self, key: ChunkKey) -> bool:
        """Whether a ``get`` of ``key`` could hit; answered from memory, no I/O."""
        ...

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        """Blocking: the verified payload of every key held; misses are left out."""
        ...

    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        """Blocking: write ``items``; the keys now held (refused ones are left out)."""
        ...

    def remove(self, keys: Sequence[ChunkKey]) -> None:
        """Blocking: drop ``keys`` (absent ones are ignored)."""
        ...

    def get_async(self, keys: Sequence[ChunkKey]) -> Future[dict[ChunkKey, memoryview]]: ...

    def put_async(self, items: Sequence[Item]) -> Future[list[ChunkKey]]: ...

    def remove_async(self, keys: Sequence[ChunkKey]) -> Future[None]: ...

    def set_demote(self, demote: Demote | None) -> None:
        """Where this tier's evicted chunks go (write-back to the next tier), or nowhere."""
        ...

    def check_invariants(self) -> None: ...

    def close(self) -> None:
        """Finish queued work, stop the workers and release resources."""
        ...


@runtime_checkable
class EventSource(Protocol):
    """A tier that publishes the chunks it stores and drops (``StoreEvent`` with its name in
    ``tier``), as the host ``ChunkStore`` does; ``TieredStore.subscribe_tiers`` uses it."""

    def subscribe(self, callback: Subscriber) -> Callable[[], None]: ...


def subscribe_batches(source: EventSource, callback: BatchSubscriber) -> Callable[[], None]:
    """``source``'s events, one call per change: through its own ``subscribe_batches``
    where it has one (``IndexEvents``), else each event as a batch of one (a tier of
    someone else's that publishes events one by one)."""
    batches = getattr(source, "subscribe_batches", None)
    if batches is not None:
        return cast("Callable[[], None]", batches(callback))
    return source.subscribe(lambda e: callback(e.kind, (e.key,), (e.slot,)))


def subscribe_named(sources: Iterable[tuple[str, EventSource]], callback: TierBatchSubscriber
                    ) -> Callable[[], None]:
    """Each named source's events, one call per change with its name first
    (``TieredStore.subscribe_tier_batches``); one unsubscribe for all of them."""
    return unsubscribe_all([subscribe_batches(source, partial(callback, name))
                            for name, source in sources])


def unsubscribe_all(stops: list[Callable[[], None]]) -> Callable[[], None]:
    """One unsubscribe that calls each of ``stops``."""

    def unsubscribe() -> None:
        for stop in stops:
            stop()

    return unsubscribe


class IndexEvents:
    """``subscribe`` for a tier that indexes its chunks in a ``ChunkStore`` (``_index``):
    the index's events, tagged with the tier's name. Chunks indexed before the call (a disk
    tier's files found at open) are not announced."""

    name: str
    _index: ChunkStore

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback`` with each event from now on, under the index lock."""
        name = self.name

        def forward(event: StoreEvent) -> None:
            callback(StoreEvent(event.kind, event.key, event.slot, name))

        return self._index.subscribe(forward)

    def subscribe_batches(self, callback: BatchSubscriber) -> Callable[[], None]:
        """Call ``callback(kind, keys, slots)`` once per change of the index from now on."""
        return self._index.subscribe_batches(callback)


class Workers:
    """A tier's worker pool, started on first ``submit`` and stopped by ``close``.

    >>> w = Workers("doc", 1)
    >>> w.submit(sum, [1, 2]).result(), w.started
    (3, True)
    >>> w.close(); w.started
    False
    """

    def __init__(self, name: str, num_workers: int) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"{name}: workers must be an integer >= 1, got {num_workers!r}")
        self.name, self.num_workers = name, num_workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        return self._pool is not None

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a worker."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.num_workers, f"kvtier-{self.name}")
            return self._pool.submit(fn, *args)

    def halves(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R | Exception]:
        """``outcomes(fn, items)``, the second half run on a worker while the calling
        thread runs the first (two cores copying at once).

        >>> w = Workers("doc", 1)
        >>> w.halves(lambda x: 10 // x, [1, 2, 0, 5])
        [10, 5, ZeroDivisionError('integer division or modulo by zero'), 2]
        >>> w.close()
        """
        cut = (len(items) + 1) // 2
        second = self.submit(outcomes, fn, items[cut:])
        try:
            first = outcomes(fn, items[:cut])
        finally:  # even on an interrupt: the worker is done with what ``fn`` writes to
            wait([second])
        return [*first, *second.result()]

    def close(self) -> None:
        """Wait for queued work, then stop the threads (a later submit starts new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def outcomes(fn: Callable[[T], R], items: Sequence[T]) -> list[R | Exception]:
    """``fn`` of each item in turn, or the exception it raised in its place."""
    out: list[R | Exception] = []
    for item in items:
        try:
            out.append(fn(item))
        except Exception as e:
            out.append(e)
    return out


class Inline:
    """A tier's synchronous mode, in place of ``Workers``: each call runs at once on the
    caller's thread and its future is returned done, so its callbacks run before
    ``submit`` returns. For tiers that do no I/O (``MetadataTier``): a hierarchy over them
    promotes within ``lookup``, deterministically.

    >>> Inline().submit(sum, [1, 2]).result()
    3
    """

    started = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)``, run now; its result or its exception in a done future."""
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args))
        except Exception as e:
            future.set_exception(e)
        return future

    def close(self) -> None:
        """Nothing to stop."""


class AsyncTwins(ABC):
    """``get_async`` / ``put_async`` / ``remove_async``: a tier's blocking calls run on its
    ``Workers`` (``self._workers``; ``Inline`` for a synchronous tier), so the engine's
    scheduler thread never waits on I/O."""

    _workers: Workers | Inline

    @abstractmethod
    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        """Verified payloads of the keys found."""

    @abstractmethod
    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        """Write the items; the keys written."""

    @abstractmethod
    def remove(self, keys: Sequence[ChunkKey]) -> None:
        """Drop the keys."""

    def get_async(self, keys: Sequence[ChunkKey]) -> Future[dict[ChunkKey, memoryview]]:
        return self._workers.submit(self.get, list(keys))

    def put_async(self, items: Sequence[Item]) -> Future[list[ChunkKey]]:
        return self._workers.submit(self.put, list(items))

    def remove_async(self, keys: Sequence[ChunkKey]) -> Future[None]:
        return self._workers.submit(self.remove, list(keys))
