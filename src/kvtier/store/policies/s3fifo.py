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

>>> s3 = S3FIFO(4)
>>> s3.on_insert(["a", "b", "c", "d"]); s3.on_access(["a"])
>>> s3.victims(1)
['b']
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterator

from kvtier.store.policies.base import Keys, Policy, count_in
from kvtier.store.policies.ghost import GhostFilter
from kvtier.store.policies.queue import KeyQueue

MAX_FREQ = 3


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
        self._small, self._main = KeyQueue(), KeyQueue()
        self._ghost = GhostFilter(self._ghost_capacity)

    def on_insert(self, keys: Keys) -> None:
        remembered = [k for k, _ in self._ghost.pop_all(keys)] if len(self._ghost) else []
        if remembered:
            self._main.push(remembered)
            fresh = set(remembered)
            self._small.push([k for k in keys if k not in fresh])
        else:
            self._small.push(keys)

    def on_access(self, keys: Keys) -> None:
        self._main.bump(self._small.bump(keys, MAX_FREQ), MAX_FREQ)

    def on_remove(self, keys: Keys) -> None:
        for k in keys:
            (self._small if k in self._small else self._main).remove(k)

    def __len__(self) -> int:
        return len(self._small) + len(self._main)

    def __contains__(self, key: object) -> bool:
        return key in self._small or key in self._main

    def resident(self) -> Iterator[Hashable]:
        yield from self._small
        yield from self._main

    def _select(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        # protected keys never move between queues here, so their counts per queue are fixed
        small, main = self._small, self._main
        in_small, in_main = count_in(protected, small), count_in(protected, main)
        chosen: list[Hashable] = []
        from_small: list[Hashable] = []
        while len(chosen) < n:
            size_small = len(small)
            small_free = size_small - in_small
            if small_free and (size_small >= self._small_target or len(main) == in_main):
                key = self._evict_small(protected, small_free)
                if key is not None:
                    chosen.append(key)
                    from_small.append(key)
            else:
                chosen.append(self._evict_main(protected))
        self._remember(from_small)
        return chosen

    def _remember(self, evicted: list[Hashable]) -> None:
        """Keys evicted from S enter the ghost. Once per ``_select``, to the same end: the
        ghost is not read while victims are chosen."""
        self._ghost.add_all(evicted, [0] * len(evicted))

    def _evict_small(self, protected: Collection[Hashable], unprotected: int) -> Hashable | None:
        """Scan S from its oldest key: promote accessed keys, evict the first unaccessed one."""
        small, main, move_at = self._small, self._main, self._move_at
        while unprotected:
            key, freq = small.pop_oldest()
            if key in protected:
                small.push((key,), freq)
                continue
            unprotected -= 1
            if freq >= move_at:
                main.push((key,))
                continue
            return key
        return None

    def _evict_main(self, protected: Collection[Hashable]) -> Hashable:
        """CLOCK over M: age keys with accesses left, evict the first without."""
        main = self._main
        while True:
            key, freq = main.pop_oldest()
            if key in protected:
                main.push((key,), freq)
            elif freq:
                main.push((key,), freq - 1)
            else:
                return key

    def check_invariants(self) -> None:
        super().check_invariants()
        if set(self._small) & set(self._main):
            raise AssertionError("s3fifo: a key is in both S and M")
        self._ghost.check_invariants()
        if len(set(self._small)) + len(set(self._main)) != len(self):
            raise AssertionError("s3fifo: a queue's length disagrees with its keys")
