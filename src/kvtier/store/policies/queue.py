"""Ordered sets of keys, oldest first, that a key can move through; and ``DictWatch``.

``KeyQueue`` (LRU's order) costs, per key, a plain dict entry whose value is a small cached
int plus one deque pointer, about half an ``OrderedDict``'s; its compactions rebuild its
dict. ``OrderedKeys`` (ARC's four lists) is a plain dict alone, in insertion order: cheaper
still, where moves are few; ``DictWatch`` keeps it at the size a fresh copy would have. A
dict that keys pass through (added at one end, deleted at the other) otherwise grows, when
its entry array fills up with deleted entries, to a power of two >= 3x its keys, twice a
fresh one.

How ``KeyQueue`` works: ``_order`` is a deque of keys, oldest on the left; moving a key to
the new end appends it again and leaves its older entry behind, stale. ``_state[k]`` packs
two fields into a small int: ``entries * 2 + live``, where ``entries`` counts ``k``'s
entries in the deque. Popping the oldest skips entries that are stale (``entries > 1``: a
newer one exists) or dead (removed). Stale and dead entries are mostly dropped that way,
as the old end is popped; the deque is compacted (at C speed) only when they outnumber the
live keys ``COMPACT_AT - 1`` times over, which bounds its length without paying a
compaction for every few moves. A compaction also rebuilds ``_state`` at its right size.

Where the serving build has its C module, LRU keeps its order in C instead
(``recency_order()``: ``kvtier._native.KeyOrder``, a linked list indexed by a hash table
of its own, so a move relinks one node and nothing is ever compacted; about 40 bytes a
key). ``KeyQueue`` stays the pure build's order and the definition both are tested
against (``tests/store/test_recency_order.py``).

>>> q = KeyQueue()
>>> q.push(["a", "b", "c"]); q.move_from(KeyQueue(), ["a"]); q.remove("b")
>>> list(q), q.pop_oldest(), len(q)
(['c', 'a'], 'c', 1)
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence
from itertools import compress, islice, repeat
from operator import and_
from typing import Final, Protocol, TypeVar, cast

try:
    from kvtier import _native
except ImportError:  # the pure build
    _native = None  # type: ignore[assignment]

K = TypeVar("K")
V = TypeVar("V")

ENTRY: Final = 2
LIVE: Final = 1
COMPACT_AT: Final = 3
"""Compact when the deque holds more than this many entries per live key (plus 64)."""


class RecencyOrder(Protocol):
    """What LRU asks of its order: ``KeyQueue``'s methods (``KeyOrder`` has the same)."""

    def __len__(self) -> int: ...
    def __contains__(self, key: object) -> bool: ...
    def __iter__(self) -> Iterator[Hashable]: ...
    def push(self, keys: Sequence[Hashable]) -> None: ...
    def to_new_end(self, keys: Sequence[Hashable]) -> None: ...
    def take(self, keys: Sequence[Hashable]) -> list[Hashable]: ...
    def remove(self, key: Hashable) -> None: ...
    def pop_unprotected(self, n: int, protected: Collection[Hashable]) -> list[Hashable]: ...
    def live_among(self, keys: Sequence[Hashable]) -> list[Hashable]: ...


def recency_order() -> RecencyOrder:
    """An empty order for LRU: in C where the serving build has it, else a ``KeyQueue``."""
    return _native.KeyOrder() if _native is not None else KeyQueue()


class KeyQueue:
    """Ordered set of hashable keys (see the module docstring)."""

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

    def live_among(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """The ``keys`` that are live here, in order (at C speed)."""
        keys = list(keys)
        flags = map(and_, map(self._state.get, keys, repeat(0)), repeat(LIVE))
        return list(compress(keys, flags))

    def push(self, keys: Sequence[Hashable]) -> None:
        """Add absent ``keys`` at the new end."""
        state = self._state
        if state.keys().isdisjoint(keys):  # no entries left behind by these keys
            for k in keys:
                state[k] = ENTRY + LIVE
        else:
            for k in keys:
                state[k] = (state.get(k, 0) & ~LIVE) + ENTRY + LIVE
        self._order.extend(keys)
        self._live += len(keys)

    def to_new_end(self, keys: Sequence[Hashable]) -> None:
        """Each key to the new end, in order (a key not here is added)."""
        self.move_from(self, keys)

    def move_from(self, other: KeyQueue, keys: Iterable[Hashable]) -> None:
        """Move each key to the new end here: a key live here keeps its place in the
        count, a key live in ``other`` leaves it, any other key is added.

        >>> a, b = KeyQueue(), KeyQueue(); a.push(["x"]); b.push(["y"])
        >>> b.move_from(a, ["x", "y", "x"]); list(a), list(b)
        ([], ['y', 'x'])
        """
        state, append = self._state, self._order.append
        ostate = other._state
        added = taken = 0
        for k in keys:
            st = state.get(k, 0)
            if not st & LIVE:
                ost = ostate.get(k, 0)
                if ost & LIVE:
                    ostate[k] = ost - LIVE
                    taken += 1
                st += LIVE
                added += 1
            state[k] = st + ENTRY
            append(k)
        self._live += added
        if taken:
            other._live -= taken
            other._maybe_compact()
        self._maybe_compact()

    def take(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """Remove the live ``keys`` found here and return them (a repeated key once);
        others are ignored."""
        state = self._state
        found = []
        for k in keys:
            st = state.get(k, 0)
            if st & LIVE:
                state[k] = st - LIVE
                found.append(k)
        self._live -= len(found)
        if found:
            self._maybe_compact()
        return found

    def remove(self, key: Hashable) -> None:
        """Forget a live key; its deque entries go stale."""
        self._state[key] -= LIVE
        self._live -= 1
        self._maybe_compact()

    def pop_oldest(self) -> Hashable:
        """Remove and return the oldest live key; the queue must not be empty."""
        assert self._live, "pop_oldest on an empty queue"
        return self.pop_unprotected(1, ())[0]

    def drop_oldest(self, n: int) -> None:
        """Forget the ``n`` oldest live keys (a ghost list trimmed to its capacity)."""
        assert n <= self._live, f"drop_oldest({n}) with {self._live} live keys"
        if n:
            self.pop_unprotected(n, ())

    def pop_unprotected(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        """Pop the ``n`` oldest live keys not in ``protected`` (the queue has them);
        protected keys met on the way move to the new end."""
        order, state = self._order, self._state
        popleft = order.popleft
        chosen: list[Hashable] = []
        passed: list[Hashable] = []
        while len(chosen) < n:  # pop entries until a live key's newest one, n times
            k = popleft()
            st = state[k]
            if st >= 2 * ENTRY:  # a newer entry of k exists further on
                state[k] = st - ENTRY
                continue
            del state[k]
            if st & LIVE:
                self._live -= 1
                (passed if protected and k in protected else chosen).append(k)
        if passed:
            self.push(passed)
        return chosen

    def _maybe_compact(self) -> None:
        if len(self._order) > COMPACT_AT * self._live + 64:
            self._compact()

    def _compact(self) -> None:
        """Drop stale and dead entries, keeping each live key's newest position."""
        # as list(self), at C speed: each key's newest entry, then the live ones
        latest = list(dict.fromkeys(reversed(self._order)))
        live = list(compress(latest, map(and_, map(self._state.__getitem__, latest), repeat(LIVE))))
        live.reverse()
        self._order = deque(live)
        self._state = dict.fromkeys(live, ENTRY + LIVE)


def fresh_copy(d: dict[K, V]) -> dict[K, V]:
    """A copy of ``d`` (same items, same order) in a table sized for its keys alone.

    Not ``dict(d)``: CPython's ``dict.copy`` (what the compiled build calls for it) clones
    the table as it is, holes and slack included, unless a third of it is holes.
    ``dict.fromkeys`` of a dict sizes the table for its keys first; the update then only
    overwrites values. Both are C loops.

    >>> d = dict.fromkeys(range(1000)); [d.pop(k) for k in range(990)] and None
    >>> import sys; sys.getsizeof(fresh_copy(d)) < sys.getsizeof(d) // 10
    True
    """
    fresh = cast("dict[K, V]", dict.fromkeys(d))
    fresh.update(d)
    return fresh


class DictWatch:
    """Says when a dict that keys pass through should be rebuilt at its fresh size.

    A dict never reuses a deleted entry's room: each new key takes a fresh entry, and when
    none is left the dict resizes to a power of two >= 3x its keys, twice the size
    ``fresh_copy(d)`` (a power of two >= 1.5x) would have; nor does it ever shrink. So after each
    batch of additions the owner asks ``after_adds``: if the dict grew since it last asked,
    it is copied (at C speed, ~25 ns a key) when at least a third of its length in keys
    were added since (at most three keys copied per key added); otherwise (a fresh copy
    would leave too little room to add keys into) the grown dict is kept. A dict that lost
    three quarters of its keys is copied too (``after_removals``).
    """

    __slots__ = ("_added", "_bytes", "_len")

    def __init__(self, d: dict[K, V]) -> None:
        self._bytes = sys.getsizeof(d)
        self._len = len(d)
        self._added = 0

    def after_adds(self, d: dict[K, V], added: int) -> dict[K, V]:
        """``d``, or a fresh copy of it (same keys, same order) to use in its place, after
        ``added`` keys were added to it."""
        self._added += added
        size = sys.getsizeof(d)
        if size == self._bytes:
            return d
        if size > self._bytes and 3 * self._added >= len(d):
            d = fresh_copy(d)
        self._reset(d)
        return d

    def after_removals(self, d: dict[K, V]) -> dict[K, V]:
        """``d``, or a fresh copy of it if it lost three quarters of its keys."""
        if 4 * len(d) >= self._len:
            return d
        d = fresh_copy(d)
        self._reset(d)
        return d

    def _reset(self, d: dict[K, V]) -> None:
        self._bytes, self._len, self._added = sys.getsizeof(d), len(d), 0


class OrderedKeys:
    """Ordered set of hashable keys, oldest first: a plain dict in insertion order.

    A key moves to the new end by deletion and insertion. The dict is its only storage:
    about 30 to 60 bytes a key, where a ``KeyQueue`` adds a deque pointer and its stale
    entries. The price: finding the oldest key skips, at C speed (~0.7 ns each), the
    deleted entries at the old end, which only a rebuild (``DictWatch``, or the dict's own
    resize) clears; fine for batches of keys and few moves, as in ARC's lists.

    >>> q = OrderedKeys()
    >>> q.push(["a", "b", "c"]); q.move_from(OrderedKeys(), ["a"]); q.remove("b")
    >>> list(q), q.pop_unprotected(1, ()), len(q)
    (['c', 'a'], ['c'], 1)
    """

    __slots__ = ("_keys", "_watch")

    def __init__(self) -> None:
        self._keys: dict[Hashable, None] = {}
        self._watch = DictWatch(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._keys)

    def live_among(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """The ``keys`` that are here, in order (at C speed)."""
        return list(filter(self._keys.__contains__, keys))

    def push(self, keys: Sequence[Hashable]) -> None:
        """Add absent ``keys`` at the new end."""
        if keys:
            self._keys.update(zip(keys, repeat(None)))
            self._keys = self._watch.after_adds(self._keys, len(keys))

    def move_from(self, other: OrderedKeys, keys: Sequence[Hashable]) -> None:
        """Move each key to the new end here, ordered by its last occurrence in ``keys``;
        a key in ``other`` leaves it, any other key is added.

        >>> a, b = OrderedKeys(), OrderedKeys(); a.push(["x"]); b.push(["y"])
        >>> b.move_from(a, ["x", "y", "x"]); list(a), list(b)
        ([], ['y', 'x'])
        """
        order = list(dict.fromkeys(reversed(keys)))  # each key once, by its last occurrence
        order.reverse()
        mine, theirs = self._keys, other._keys
        for k in order:
            if k in mine:
                del mine[k]
            elif k in theirs:
                del theirs[k]
        mine.update(zip(order, repeat(None)))
        other._keys = other._watch.after_removals(theirs)
        self._keys = self._watch.after_adds(mine, len(order))

    def remove(self, key: Hashable) -> None:
        """Forget a key that is here."""
        del self._keys[key]
        self._keys = self._watch.after_removals(self._keys)

    def drop_oldest(self, n: int) -> None:
        """Forget the ``n`` oldest keys (a ghost list trimmed to its capacity)."""
        assert n <= len(self._keys), f"drop_oldest({n}) with {len(self._keys)} keys"
        if n:
            self.pop_unprotected(n, ())

    def pop_unprotected(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        """Pop the ``n`` oldest keys not in ``protected`` (the set has them); protected
        keys met on the way move to the new end, in the order met."""
        keys = self._keys
        if not protected:
            chosen = list(islice(keys, n))
            passed: list[Hashable] = []
        else:
            chosen, passed = [], []
            for k in keys:  # read only: the dict changes after the loop
                if k in protected:
                    passed.append(k)
                else:
                    chosen.append(k)
                    if len(chosen) == n:
                        break
        for k in chosen:
            del keys[k]
        for k in passed:
            del keys[k]
        self._keys = self._watch.after_removals(keys)
        self.push(passed)
        return chosen
