"""S3-FIFO (Yang et al., SOSP 2023): a small FIFO, a main FIFO and a ghost FIFO.

New keys enter the small queue ``S`` (about 10% of the capacity); keys whose ghost is
remembered enter the main queue ``M`` directly. Each resident key has a 2-bit access count
(0..3). Eviction takes from ``S`` while ``S`` holds at least ``small_ratio * capacity`` keys,
else from ``M``:

* from ``S``: the oldest key moves to ``M`` (count reset to 0) if it was accessed at least
  ``move_to_main_at`` times while in ``S``; otherwise it is evicted and its key enters the
  ghost ``G``: a ``GhostFilter`` remembering, in a few bits each, the last ``g`` to ``2 g``
  keys evicted from ``S`` (``g``: ``M``'s share of the capacity);
* from ``M``: the oldest key with count > 0 is reinserted at the new end with count - 1;
  the first with count 0 is evicted.

One-hit wonders thus leave quickly through ``S``, and ``M`` behaves like CLOCK. This is the
unified-capacity form: moving a key from ``S`` to ``M`` frees nothing, the scan goes on.
Protected keys met during a scan are rotated to the new end of their queue, unchanged.

Storage: no key ever moves inside a queue (only from the old end to a new end), so ``S``
and ``M`` are plain deques holding each resident key once, and one dict gives each key
its queue and count as a small int (``in_main * 4 + count``, cached by Python: no object
per key). A scan is one loop over the deques, and a removal (rare: ``on_remove``) filters
them. Keys pass through the dict (added on insert, deleted on eviction), so a
``DictWatch`` keeps it at a fresh copy's size, half what it would grow to.

>>> s3 = S3FIFO(4)
>>> s3.on_insert(["a", "b", "c", "d"]); s3.on_access(["a"])
>>> s3.victims(1)
['b']
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Hashable, Iterator
from itertools import filterfalse, islice, repeat
from operator import sub
from typing import Final

from kvtier.store.policies.base import Keys, Policy
from kvtier.store.policies.ghost import GhostFilter
from kvtier.store.policies.queue import DictWatch

MAX_FREQ: Final = 3
IN_MAIN: Final = 4
"""Added to a key's count in ``_state`` when the key is in ``M``."""
GHOST_CELLS_PER_KEY = 16
"""The ghost filter's cells: 16 to 32 per key (2 to 4 bytes a resident chunk, ~1% false
positives; see ``GhostFilter``), half its default, to fit the metadata budget."""
_BUMPED: Final = tuple(v if v & MAX_FREQ == MAX_FREQ else v + 1 for v in range(2 * IN_MAIN))
"""``_BUMPED[state]``: the state after one more access (the count saturates at 3)."""


class S3FIFO(Policy):
    """S3-FIFO over ``capacity`` slots (see the module docstring)."""

    name = "s3fifo"

    def __init__(
        self, capacity: int, *, small_ratio: float = 0.1, move_to_main_at: int = 1
    ) -> None:
        super().__init__(capacity)
        if not 0.0 < small_ratio < 1.0:
            raise ValueError(f"s3fifo: small_ratio must be in (0, 1), got {small_ratio!r}")
        if not 1 <= move_to_main_at <= MAX_FREQ:
            raise ValueError(f"s3fifo: move_to_main_at must be in [1, {MAX_FREQ}]")
        self._small_target = small_ratio * capacity
        self._ghost_capacity = max(1, capacity - int(self._small_target))
        self._move_at = move_to_main_at
        self._small: deque[Hashable] = deque()  # S, oldest first
        self._main: deque[Hashable] = deque()  # M, oldest first
        self._state: dict[Hashable, int] = {}  # resident key -> in_main * IN_MAIN + count
        self._state_watch = DictWatch(self._state)
        self._ghost = GhostFilter(self._ghost_capacity, cells_per_key=GHOST_CELLS_PER_KEY)

    def on_insert(self, keys: Keys) -> None:
        state = self._state
        remembered = [k for k, _ in self._ghost.pop_all(keys)] if len(self._ghost) else []
        if remembered:
            back = set(remembered)
            fresh = [k for k in keys if k not in back]
            self._main.extend(remembered)
            state.update(zip(remembered, repeat(IN_MAIN)))
        else:
            fresh = list(keys)
        self._small.extend(fresh)
        state.update(zip(fresh, repeat(0)))
        self._state = self._state_watch.after_adds(state, len(keys))

    def on_access(self, keys: Keys) -> None:
        # state[k] = _BUMPED[state[k]] for each key in turn, at C speed (update reads each
        # state after the previous writes, so a repeated key counts twice)
        state = self._state
        state.update(zip(keys, map(_BUMPED.__getitem__, map(state.__getitem__, keys)), strict=True))

    def on_remove(self, keys: Keys) -> None:
        gone = set(keys)
        for k in gone:
            del self._state[k]
        self._small = deque(filterfalse(gone.__contains__, self._small))
        self._main = deque(filterfalse(gone.__contains__, self._main))

    def __len__(self) -> int:
        return len(self._state)

    def __contains__(self, key: object) -> bool:
        return key in self._state

    def resident(self) -> Iterator[Hashable]:
        return iter(self._state)

    def _select(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        # protected keys never move between queues here, so their counts per queue are fixed
        in_queues = self._count_protected(protected)
        chosen: list[Hashable] = []
        from_small: list[Hashable] = []
        while len(chosen) < n:
            self._evict_small(n, protected, in_queues, chosen, from_small)
            if len(chosen) == n:
                break
            if protected:  # S has no turn now: M gives one, then S may again
                chosen.append(self._evict_main(protected))
            else:  # S has no turn until M is empty: M gives all it can
                self._clock_main(n - len(chosen), chosen)
        self._ghost.add_all(from_small, [0] * len(from_small))
        return chosen

    def _count_protected(self, protected: Collection[Hashable]) -> tuple[int, int]:
        """How many ``protected`` keys are in S, and in M."""
        in_small = in_main = 0
        for k in protected:
            v = self._state.get(k)
            if v is not None:
                if v >= IN_MAIN:
                    in_main += 1
                else:
                    in_small += 1
        return in_small, in_main

    def _evict_small(
        self, n: int, protected: Collection[Hashable], in_queues: tuple[int, int],
        chosen: list[Hashable], from_small: list[Hashable],
    ) -> None:
        """Evict from S while it has the turn (it holds unprotected keys, and is at its
        target size or M has none to give) and fewer than ``n`` are chosen. Each eviction
        scans S from its oldest key: accessed keys are promoted, the first unaccessed
        one is evicted; a scan may promote them all and evict none."""
        small, main, state, move_at = self._small, self._main, self._state, self._move_at
        target, (in_small, in_main) = self._small_target, in_queues
        while len(chosen) < n:
            size_small = len(small)
            unprotected = size_small - in_small
            if not unprotected or (size_small < target and len(main) > in_main):
                return
            while unprotected:
                key = small.popleft()
                if protected and key in protected:
                    small.append(key)
                    continue
                unprotected -= 1
                if state[key] >= move_at:
                    state[key] = IN_MAIN
                    main.append(key)
                    continue
                del state[key]
                chosen.append(key)
                from_small.append(key)
                break

    def _evict_main(self, protected: Collection[Hashable]) -> Hashable:
        """CLOCK over M: age keys with accesses left, evict the first without."""
        main, state = self._main, self._state
        while True:
            key = main.popleft()
            if protected and key in protected:
                main.append(key)
                continue
            v = state[key]
            if v > IN_MAIN:
                state[key] = v - 1
                main.append(key)
                continue
            del state[key]
            return key

    def _clock_main(self, k: int, chosen: list[Hashable]) -> None:
        """``_evict_main`` ``k`` times (or until M is empty) when nothing is protected, a
        block of M's oldest keys at a time: read their states at once, find the next key
        without accesses left (``list.index``), age the run before it and rotate it to the
        new end (one ``update``, one ``rotate``), and evict it."""
        main, state = self._main, self._state
        want = len(chosen) + k
        while len(chosen) < want and main:
            block = list(islice(main, min(len(main), 2 * k + 14)))
            counts = list(map(state.__getitem__, block))
            at = 0
            while len(chosen) < want:
                try:
                    zero = counts.index(IN_MAIN, at)
                except ValueError:
                    zero = len(block)
                if zero > at:  # these have accesses left: one less, and to the new end
                    aged = map(sub, counts[at:zero], repeat(1))
                    state.update(zip(block[at:zero], aged, strict=True))
                    main.rotate(at - zero)
                if zero == len(block):
                    break
                victim = main.popleft()
                del state[victim]
                chosen.append(victim)
                at = zero + 1

    def check_invariants(self) -> None:
        super().check_invariants()
        small, main, state = set(self._small), set(self._main), self._state
        if small & main or len(small) + len(main) != len(state):
            raise AssertionError("s3fifo: a key is in both S and M, or in neither")
        if len(self._small) + len(self._main) != len(state):
            raise AssertionError("s3fifo: a queue holds a key twice")
        if any((state.get(k, -1) >= IN_MAIN) != (k in main) for k in small | main):
            raise AssertionError("s3fifo: a key's state names the wrong queue")
        self._ghost.check_invariants()
