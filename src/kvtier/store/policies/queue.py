"""``KeyQueue``: a compact ordered set of keys, oldest first, each with a 2-bit value.

Policies keep their lists (LRU order, ARC's T1/T2/B1/B2, S3-FIFO's S/M/G) in these rather
than in ``OrderedDict``s, because a queue entry costs about half as much memory (a plain
dict entry whose value is a small cached int, plus one deque pointer), which keeps the
store's metadata under 256 bytes per resident chunk.

How: ``_order`` is a deque of keys, oldest on the left; moving a key to the new end appends
it again and leaves its older entry behind, stale. ``_state[k]`` packs three fields into a
small int: ``entries * 8 + live * 4 + value``, where ``entries`` counts ``k``'s entries in
the deque. Popping the oldest skips entries that are stale (``entries > 1``: a newer one
exists) or dead (removed). The deque is compacted when its stale and dead entries
outnumber the live keys (amortised O(1) per operation: a compaction costs O(entries) and
follows at least as many moves). Eviction drops stale entries from the old end as it goes,
so a queue that also evicts rarely needs one; a compaction also rebuilds ``_state`` at its
right size.

>>> q = KeyQueue()
>>> q.push(["a", "b", "c"]); q.move_to_end(["a"]); q.remove("b")
>>> list(q), q.pop_oldest(), len(q)
(['c', 'a'], ('c', 0), 1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence
from itertools import compress, repeat
from operator import add, and_, eq

ENTRY, LIVE, VALUE = 8, 4, 3


class KeyQueue:
    """Ordered set of hashable keys with values in 0..3 (see the module docstring)."""

    __slots__ = ("_live", "_order", "_state")

    def __init__(self) -> None:
        self._order: deque[Hashable] = deque()
        self._state: dict[Hashable, int] = {}
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def __contains__(self, key: object) -> bool:
        return bool(self._state.get(key, 0) & LIVE)

    def __iter__(self) -> Iterator[Hashable]:
        """Live keys, oldest first (O(entries); for checks, tests and compaction)."""
        return reversed(self._live_newest_first())

    def _live_newest_first(self) -> list[Hashable]:
        """Live keys, newest first: each key's newest entry (``dict.fromkeys`` over the
        reversed deque keeps the first, i.e. newest, at C speed), dead keys dropped."""
        state = self._state
        return [k for k in dict.fromkeys(reversed(self._order)) if state[k] & LIVE]

    def push(self, keys: Iterable[Hashable], value: int = 0) -> None:
        """Add absent ``keys`` at the new end with ``value``."""
        state, append = self._state, self._order.append
        n = 0
        for k in keys:
            state[k] = (state.get(k, 0) & ~(LIVE | VALUE)) + ENTRY + LIVE + value
            append(k)
            n += 1
        self._live += n

    def move_to_end(self, keys: Sequence[Hashable]) -> None:
        """Move live ``keys`` to the new end, keeping their values."""
        order = self._order
        if len(order) >= len(keys) and all(map(eq, reversed(keys), reversed(order))):
            return  # already the newest entries, in this order (a repeated access): no change
        state = self._state
        for k in keys:
            state[k] += ENTRY
        self._order.extend(keys)
        self._maybe_compact()

    def bump(self, keys: Iterable[Hashable], most: int = VALUE) -> list[Hashable]:
        """Add one to the value (up to ``most``) of each live key here; the other keys.

        >>> q = KeyQueue(); q.push(["a"]); q.bump(["a", "b", "a"]), q.value("a")
        (['b'], 2)
        """
        state = self._state
        others = []
        for k in keys:
            st = state.get(k, 0)
            if st & LIVE:
                if st & VALUE < most:
                    state[k] = st + 1
            else:
                others.append(k)
        return others

    def take(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """Remove the live ``keys`` found here and return them (a repeated key once);
        others are ignored."""
        state = self._state
        found = []
        for k in keys:
            st = state.get(k, 0)
            if st & LIVE:
                state[k] = st & ~(LIVE | VALUE)
                found.append(k)
        self._live -= len(found)
        if found:
            self._maybe_compact()
        return found

    def move_or_push(self, keys: Iterable[Hashable]) -> None:
        """Move each key to the new end, adding it (value 0) if it is not live here."""
        state, append = self._state, self._order.append
        added = 0
        for k in keys:
            st = state.get(k, 0)
            if not st & LIVE:
                st = (st & ~VALUE) + LIVE
                added += 1
            state[k] = st + ENTRY
            append(k)
        self._live += added
        self._maybe_compact()

    def value(self, key: Hashable) -> int:
        return self._state[key] & VALUE

    def set_value(self, key: Hashable, value: int) -> None:
        """Change a live key's value in place (its position is unchanged)."""
        self._state[key] = (self._state[key] & ~VALUE) | value

    def remove(self, key: Hashable) -> None:
        """Forget a live key; its deque entries go stale."""
        self._state[key] &= ~(LIVE | VALUE)
        self._live -= 1
        self._maybe_compact()

    def pop_oldest(self) -> tuple[Hashable, int]:
        """Remove and return the oldest live key and its value; the queue must not be empty."""
        assert self._live, "pop_oldest on an empty queue"
        return self._pop_live()

    def _pop_live(self) -> tuple[Hashable, int]:
        """Pop entries from the old end until a live key's newest entry; it and its value."""
        order, state = self._order, self._state
        while True:
            k = order.popleft()
            st = state[k]
            if st >= 2 * ENTRY:  # a newer entry of k exists further on
                state[k] = st - ENTRY
                continue
            del state[k]
            if st & LIVE:
                self._live -= 1
                return k, st & VALUE

    def drop_oldest(self, n: int) -> None:
        """Forget the ``n`` oldest live keys (a ghost list trimmed to its capacity)."""
        assert n <= self._live, f"drop_oldest({n}) with {self._live} live keys"
        for _ in range(n):
            self.pop_oldest()

    def pop_unprotected(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        """Pop the ``n`` oldest live keys not in ``protected`` (the queue has them);
        protected keys met on the way move to the new end with their values."""
        chosen: list[Hashable] = []
        passed: list[tuple[Hashable, int]] = []
        while len(chosen) < n:
            k, value = self._pop_live()
            if k in protected:
                passed.append((k, value))
            else:
                chosen.append(k)
        for k, value in passed:
            self.push((k,), value)
        return chosen

    def _maybe_compact(self) -> None:
        if len(self._order) > 2 * self._live + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop stale and dead entries, keeping each live key's newest position."""
        # as list(self) and {k: (state[k] & (LIVE | VALUE)) + ENTRY for k in live}, at C speed
        latest = list(dict.fromkeys(reversed(self._order)))  # each key once, newest first
        latest.reverse()
        fields = list(map(and_, map(self._state.__getitem__, latest), repeat(LIVE | VALUE)))
        live = list(compress(latest, map(and_, fields, repeat(LIVE))))
        kept = compress(fields, map(and_, fields, repeat(LIVE)))
        self._order = deque(live)
        self._state = dict(zip(live, map(add, kept, repeat(ENTRY)), strict=True))
