"""The eviction-policy interface: a policy orders resident chunks and picks victims.

A policy never counts slots, frees memory or decides *whether* to evict: the store manager
does all of that, in its one eviction loop. The manager tells the policy what happened,
a batch of keys at a time (one request's keys, in request order):

* ``on_insert(keys)``: the keys became readable (a store completed); the manager calls
  ``on_insert_with_parents(keys, parents)``, which prefix-aware policies override and the
  others inherit (it calls ``on_insert``), with the parents its caller gave, if any;
* ``on_access(keys)``: the keys were used (a load completed or was released, or ``touch``);
* ``on_remove(keys)``: the keys were removed on request (not evicted; no history kept);

and asks it ``victims(n, protected)``: exactly ``n`` resident keys, none in ``protected``,
in eviction order, or ``None`` when fewer than ``n`` unprotected keys are resident. It is
all-or-nothing: on ``None`` the policy is unchanged; on a list, the policy has already
forgotten those keys (and may remember them as ghosts) and the manager must evict them.
Protected keys are in use (pinned by a load, or offered by the store being prepared):
a scan that meets one moves it to the new end of its queue, as if just used.

Only ready chunks are resident in a policy: a chunk being written is unknown to it until
``on_insert``. Pinned chunks stay resident and arrive in ``protected``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Hashable, Iterator, Sequence
from typing import ClassVar

from mypy_extensions import mypyc_attr

Keys = Sequence[Hashable]


@mypyc_attr(allow_interpreted_subclasses=True)
class Policy(ABC):
    """Base class of eviction policies over ``capacity`` slots.

    Subclasses implement the three notifications, ``_select`` (which may assume that
    enough unprotected keys exist), ``__len__``, ``__contains__`` and ``resident``.
    """

    name: ClassVar[str]

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"{self.name}: capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity

    @abstractmethod
    def on_insert(self, keys: Keys) -> None:
        """``keys`` (distinct, not resident) became ready."""

    def on_insert_with_parents(self, keys: Keys, parents: Sequence[Hashable | None]) -> None:
        """``on_insert``, with a hint: ``parents[i]`` is the key of the chunk before
        ``keys[i]`` (same request, same group), or None for a first chunk; ``()`` when the
        caller gave none. Policies that ignore prefix structure inherit this."""
        self.on_insert(keys)

    @abstractmethod
    def on_access(self, keys: Keys) -> None:
        """``keys`` (resident) were used, in this order."""

    @abstractmethod
    def on_remove(self, keys: Keys) -> None:
        """``keys`` (distinct, resident) were removed on request; forget them, no ghosts."""

    @abstractmethod
    def __len__(self) -> int:
        """How many keys are resident."""

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is resident."""

    @abstractmethod
    def resident(self) -> Iterator[Hashable]:
        """Every resident key (order unspecified); for invariant checks."""

    @abstractmethod
    def _select(self, n: int, protected: Collection[Hashable]) -> list[Hashable]:
        """Pick and forget ``n`` unprotected resident keys; enough of them exist."""

    def victims(self, n: int, protected: Collection[Hashable] = ()) -> list[Hashable] | None:
        """``n`` keys to evict, none of them in ``protected``, or None (nothing changes).

        >>> from kvtier.store.policies import LRU
        >>> lru = LRU(3)
        >>> lru.on_insert(["a", "b", "c"])
        >>> lru.victims(2, protected={"a"}), lru.victims(2, protected={"a"})
        (['b', 'c'], None)
        """
        if n <= 0:
            return []
        # counted only when the protected keys could be too many (each takes one at most)
        if len(protected) > len(self) - n and self.num_unprotected(protected) < n:
            return None
        chosen = self._select(n, protected)
        assert len(chosen) == n, chosen
        assert not (protected and any(map(protected.__contains__, chosen))), chosen
        return chosen

    def num_unprotected(self, protected: Collection[Hashable]) -> int:
        """Resident keys that are not in ``protected``."""
        return len(self) - count_in(protected, self)

    def check_invariants(self) -> None:
        """Raise AssertionError if internal structures disagree (subclasses extend)."""
        if len(self) > self.capacity:
            raise AssertionError(f"{self.name}: {len(self)} resident > capacity {self.capacity}")


def count_in(protected: Collection[Hashable], queue: Collection[Hashable] | Policy) -> int:
    """How many protected keys are in ``queue``."""
    return sum(map(queue.__contains__, protected)) if protected else 0
