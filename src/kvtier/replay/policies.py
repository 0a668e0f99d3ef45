"""The policies a replay compares: every registered policy, Belady, and an infinite cache.

Online policies come from ``kvtier.store.POLICIES`` (new registrations are picked up
automatically). Belady, the offline optimum, needs the future: the replay knows the whole
trace, so the future is every request's references (``RequestRefs.keys``) in replay order,
given as each key's positions (``Workload.future``, one streaming pass).
The infinite cache is a store with a slot for every distinct chunk of the trace: nothing
is ever evicted, so its hit rate is the ceiling of any policy.

``ReplayBelady`` counts one use per (request, chunk) reference. The store reports uses as
it sees them, and the planner may report a hit twice (its lookup pins, ``accept_hit``
touches) or not at all (a chunk the request references but neither loads nor stores):
``begin`` announces a request's references, the first report of each counts, repeats are
ignored, and ``end`` counts the ones never reported, so that Belady's i-th use of a chunk
is always its i-th occurrence in the future.

>>> b = ReplayBelady(1, future=["a", "b", "a"])
>>> b.begin(["a"]); b.on_insert(["a"]); b.on_access(["a"]); b.end(["a"])
>>> b.next_use("a")
2
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from kvtier.store import POLICIES, Belady, Policy, make_policy
from kvtier.store.policies.belady import FutureIndex

BELADY = Belady.name
INFINITE = "infinite"


def compared_policies() -> list[str]:
    """Every registered online policy (``lru`` first), then Belady and the infinite cache."""
    online = sorted(POLICIES.keys() - {BELADY}, key=lambda p: (p != "lru", p))
    return [*online, BELADY, INFINITE]


def known_policy(name: str) -> str:
    """``name`` if the replay can run it, else ValueError listing the known ones."""
    if name not in POLICIES and name != INFINITE:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(compared_policies())} "
                         "(or 'all' to compare every one)")
    return name


def build_policy(
    name: str, num_slots: int, future: Sequence[Hashable] | FutureIndex
) -> Policy:
    """A new policy over ``num_slots`` slots; Belady is given ``future`` (the keys in
    order, or their ``FutureIndex``)."""
    if name == BELADY:
        return ReplayBelady(num_slots, future)
    if name == INFINITE:
        return make_policy("lru", num_slots)
    return make_policy(name, num_slots)


class ReplayBelady(Belady):
    """Belady counting exactly one use per reference (see the module docstring)."""

    def __init__(self, capacity: int, future: Sequence[Hashable] | FutureIndex = ()) -> None:
        super().__init__(capacity, future)
        self._owed: Counter[Hashable] = Counter()  # references announced, not yet counted
        self._active: Counter[Hashable] = Counter()  # live requests referencing the key

    def begin(self, keys: Sequence[Hashable]) -> None:
        """A request referencing ``keys`` (distinct) starts."""
        self._owed.update(keys)
        self._active.update(keys)

    def end(self, keys: Sequence[Hashable]) -> None:
        """The request that began with ``keys`` ends: count its unreported references."""
        owed, active = self._owed, self._active
        for k in keys:
            active[k] -= 1
            if owed[k] > active[k]:
                self._count(k)
                if k in self:
                    super()._use([k])
                else:
                    self.skip(k)
            if not active[k]:
                del active[k]
                owed.pop(k, None)

    def _count(self, key: Hashable) -> bool:
        """Take one owed reference of ``key``; False when none is owed (a repeat)."""
        if self._owed[key] > 0:
            self._owed[key] -= 1
            return True
        return False

    def _use(self, keys: Sequence[Hashable]) -> None:
        fresh = [k for k in keys if self._count(k)]
        super()._use(fresh)
        for k in keys:
            if k not in self:  # an insert that repeats a counted reference: re-read its use
                self.uncount(k)
                super()._use([k])
