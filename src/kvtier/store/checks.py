"""What the chunk store manager checks: its arguments on the way in, and, in tests, its
accounting recomputed from scratch (``ChunkStore.check_invariants``).

The invariant checks take the manager's state as plain data, so that this module needs no
manager: a store whose counts drift fails here with what disagrees.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import cast

from kvtier.keys import ChunkKey
from kvtier.store.backend import SlotBackend
from kvtier.store.policies import Policy, make_policy
from kvtier.store.results import HandleError, LoadHandle, StoreHandle, checked_keys

# ---- arguments -------------------------------------------------------------------------

def take_handle(
    live: dict[int, LoadHandle] | dict[int, StoreHandle], handle: object, kind: str
) -> None:
    """Remove ``handle`` from ``live`` or raise ``HandleError`` (changing nothing)."""
    hid = getattr(handle, "id", None)
    if not isinstance(hid, int) or live.get(hid) is not handle:
        raise HandleError(
            f"complete_{kind}: {type(handle).__name__} {hid!r} is not a live {kind} handle of "
            f"this store (already completed, from another store, or not a {kind} handle)"
        )
    del live[hid]


def parent_hint(
    ks: list[ChunkKey], parents: Sequence[object] | None
) -> list[ChunkKey | None] | None:
    """``prepare_store``'s hint as a list, one parent per key (None without one);
    ValueError if it does not give one 40-byte key or None per key."""
    if parents is None:
        return None
    ps = list(parents)
    if len(ps) != len(ks):
        raise ValueError(f"prepare_store: {len(ps)} parents for {len(ks)} keys; give one each")
    checked_keys([p for p in ps if p is not None])
    return cast("list[ChunkKey | None]", ps)


def parents_of(offered: list[ChunkKey], hint: list[ChunkKey | None], new: list[ChunkKey],
               distinct: bool) -> tuple[ChunkKey | None, ...]:
    """The hint's parents of ``new``, keys of ``offered`` in its order (whose parents
    ``hint`` lists, in order; a key offered twice takes its last parent). ``distinct``:
    no key is offered twice."""
    tail = len(offered) - len(new)
    if offered[tail:] == new:  # all of them, or the last ones (the others held already)
        return tuple(hint[tail:])
    if distinct:  # ``new`` is a subsequence of ``offered``: walked, nothing hashed
        out: list[ChunkKey | None] = []
        j, n = 0, len(new)
        # one parent each (check_parents); a bare zip, which mypyc compiles into a loop
        for k, parent in zip(offered, hint):  # noqa: B905
            if j < n and k == new[j]:
                out.append(parent)
                j += 1
        if j == n:
            return tuple(out)
    by_key = dict(zip(offered, hint, strict=True))
    return tuple([by_key[k] for k in new])


def resolve_num_slots(num_slots: int | None, backend: SlotBackend | None) -> int:
    if (num_slots is None) == (backend is None):
        raise ValueError(
            "ChunkStore: give exactly one of num_slots (metadata-only) or backend (a tier)"
        )
    if backend is not None:
        return backend.num_slots
    if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
        raise ValueError(f"ChunkStore: num_slots must be an integer >= 1, got {num_slots!r}")
    return num_slots


def resolve_policy(policy: str | Policy, num_slots: int) -> Policy:
    if isinstance(policy, str):
        return make_policy(policy, num_slots)
    if not isinstance(policy, Policy):
        raise ValueError(f"ChunkStore: policy must be a name or a Policy, got {policy!r}")
    if policy.capacity != num_slots or len(policy):
        raise ValueError(
            f"ChunkStore: the policy must be new and built for {num_slots} slots "
            f"(capacity {policy.capacity}, {len(policy)} resident)"
        )
    return policy


# ---- invariants ------------------------------------------------------------------------

def check_slots(
    free: list[int], slots: Mapping[ChunkKey, int], num_slots: int, num_writing: int,
    pinned: Mapping[ChunkKey, int],
) -> None:
    """Every slot is free or held by one key; the writing count and the pins agree."""
    used = [v if v >= 0 else ~v for v in slots.values()]
    if sorted(free + used) != list(range(num_slots)):
        raise AssertionError(f"slots leaked or shared: {len(free)} free, {len(used)} used")
    if num_writing != len(writing_keys(slots)):
        raise AssertionError("the writing count disagrees with the writing keys")
    if not pinned.keys() <= slots.keys() - writing_keys(slots):
        raise AssertionError("a pinned key is not ready")


def writing_keys(slots: Mapping[ChunkKey, int]) -> set[ChunkKey]:
    """The keys being written: their slot is held as ``~slot``."""
    return {k for k, v in slots.items() if v < 0}


def check_handles(
    slots: Mapping[ChunkKey, int], stores: Mapping[int, StoreHandle],
    loads: Mapping[int, LoadHandle], pinned: Mapping[ChunkKey, int],
) -> None:
    """The live handles name exactly the writing and pinned keys, and their slots."""
    writers = [k for h in stores.values() for k in h.keys]
    writing = writing_keys(slots)
    if len(writers) != len(writing) or set(writers) != writing:
        raise AssertionError("writing keys disagree with the live store handles")
    for sh in stores.values():
        if tuple(~slots[k] for k in sh.keys) != sh.slots:
            raise AssertionError(f"store handle {sh.id} names the wrong slots")
    pins = Counter(k for h in loads.values() for k in h.keys)
    if pins != Counter(pinned) or 0 in pinned.values():
        raise AssertionError("pin counts disagree with the live load handles")
    for h in loads.values():
        if tuple(slots[k] for k in h.keys) != h.slots:
            raise AssertionError(f"load handle {h.id} names the wrong slots")


def check_policy(policy: Policy, slots: Mapping[ChunkKey, int]) -> None:
    """The policy holds exactly the ready keys, and its own invariants hold."""
    ready = slots.keys() - writing_keys(slots)
    if len(policy) != len(ready) or set(policy.resident()) != ready:
        raise AssertionError(
            f"policy holds {len(policy)} keys, the store {len(ready)} ready chunks"
        )
    policy.check_invariants()
