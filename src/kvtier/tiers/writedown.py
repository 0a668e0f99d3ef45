"""Writing down: host memory's evicted (write-back) or stored (write-through) chunks on their
way to the tiers below, and the background work a hierarchy waits for.

``WriteDown`` copies a chunk's bytes out of its slot while the host lock is held (the slot
still holds them: ``tiered``'s docstring says why that is early enough), zeroes a slot as it
is freed, and sends each call's copies down in one batch once the host call returns: to the
next tier under write-back (which hands its own evictions further down), to every tier
under write-through. ``Background`` counts every future a hierarchy started (promotions,
write-downs, removals) until it and its continuation are done, so ``flush`` waits for all.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any

from kvtier.keys import ChunkKey
from kvtier.store.backend import SlotBackend
from kvtier.tiers.config import WritePolicy
from kvtier.tiers.host import HostSlab
from kvtier.tiers.lower import Item, LowerTier, TierStats

_log = logging.getLogger("kvtier.tiers.tiered")


class Background:
    """Futures started on a hierarchy's behalf, until each and its continuation are done; a
    future that fails counts an error in ``stats`` and is logged."""

    def __init__(self, lock: threading.RLock | threading.Lock, stats: TierStats) -> None:
        self._lock, self._stats = lock, stats
        self._pending: set[Future[Any]] = set()

    def track(
        self, future: Future[Any], then: Callable[[Future[Any]], None] | None = None
    ) -> None:
        """Count ``future`` until it and ``then(future)`` are done (so ``flush`` also waits
        for what ``then`` starts)."""
        with self._lock:
            self._pending.add(future)
        if then is not None:
            future.add_done_callback(then)
        future.add_done_callback(self._done)

    def _done(self, future: Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)
        if future.exception() is not None:
            self._stats.add(errors=1)
            _log.error("kvtier tier task failed", exc_info=future.exception())

    def flush(self, timeout_s: float | None = 30.0) -> bool:
        """Wait until nothing tracked is in flight; False on timeout."""
        if not self._pending:  # nothing started (a replay asks before every request)
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            wait(pending, timeout=left)


class WriteDown:
    """Chunks leaving host memory for ``lower`` (module docstring). Every method but
    ``send`` runs under the host lock ``lock``."""

    def __init__(self, lower: Sequence[LowerTier], write_policy: WritePolicy,
                 backend: SlotBackend, lock: threading.RLock | threading.Lock,
                 background: Background) -> None:
        self.lower, self.write_policy, self.backend = tuple(lower), write_policy, backend
        self._lock, self._background = lock, background
        self._outbox: list[Item] = []  # chunks to write down once the host call returns
        self._going_down: Counter[ChunkKey] = Counter()  # evicted, being written down
        if write_policy == "write-back":
            for upper, below in itertools.pairwise(self.lower):
                upper.set_demote(self._demoter(below))

    def copy(self, key: ChunkKey, slot: int) -> None:
        """Take ``slot``'s bytes now, to send down as ``key`` (under the host lock)."""
        self._outbox.append((key, self.backend.read(slot)))

    def going_down(self, key: ChunkKey) -> bool:
        """Evicted, and still on its way to the next tier."""
        return key in self._going_down

    def clear(self, slot: int) -> None:
        """Zero a slot being freed (``HostSlab.clear``: free slots are zero past the
        smallest chunk), so a shorter chunk stored there later carries none of this one's
        bytes to a lower tier."""
        if isinstance(self.backend, HostSlab):
            self.backend.clear(slot)
        else:
            self.backend.write(slot, bytes(self.backend.slot_bytes))

    def send(self) -> None:
        """One batch to the next tier (write-back) or to every tier (write-through)."""
        if not self._outbox:  # nothing copied (most calls); a copy made meanwhile by
            return  # another thread is sent by that thread's own send, which follows it
        with self._lock:
            items, self._outbox = self._outbox, []
            if items:
                self._send(items)

    def _send(self, items: list[Item]) -> None:
        """``send``'s batch, under the lock (a function of its own: the callback below
        is a closure, which the compiled build makes an object for at every call)."""
        if self.write_policy == "write-through":
            for tier in self.lower:
                self._background.track(tier.put_async(items))
            return
        keys = [k for k, _ in items]
        self._going_down.update(keys)
        self._background.track(self.lower[0].put_async(items), lambda _: self._landed(keys))

    def unsent(self) -> int:
        """Chunks copied but not sent down (zero between calls: ``check_invariants``)."""
        return len(self._outbox)

    def _landed(self, keys: list[ChunkKey]) -> None:
        with self._lock:
            self._going_down.subtract(keys)
            self._going_down += Counter()  # drop zero counts

    def _demoter(self, below: LowerTier) -> Callable[[ChunkKey, bytes], None]:
        def demote(key: ChunkKey, payload: bytes) -> None:
            with self._lock:
                self._background.track(below.put_async([(key, payload)]))

        return demote
