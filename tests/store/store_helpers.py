"""Helpers shared by the store tests: readable keys and a one-key-per-access simulator."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from kvtier.keys import ChunkKey
from kvtier.store import Belady, ChunkStore, Policy, StoreHandle


def key(name: object) -> ChunkKey:
    """A 40-byte key named by ``name`` (``key("a") != key("b")``)."""
    return ChunkKey(hashlib.blake2b(str(name).encode(), digest_size=40).digest())


def keys(names: Iterable[object]) -> list[ChunkKey]:
    return [key(n) for n in names]


def store_ok(store: ChunkStore, ks: list[ChunkKey]) -> StoreHandle:
    """prepare_store + complete_store(ok=True); fails the test on a refusal."""
    handle = store.prepare_store(ks)
    assert isinstance(handle, StoreHandle), handle
    store.complete_store(handle, ok=True)
    return handle


def simulate(store: ChunkStore, trace: Iterable[object]) -> str:
    """Access each name in turn: a hit is touched, a miss stored. 'H'/'M' per access."""
    out = []
    for name in trace:
        k = key(name)
        if store.lookup([k])[0].readable:
            store.touch([k])
            out.append("H")
        else:
            store_ok(store, [k])
            out.append("M")
        store.check_invariants()
    return "".join(out)


def make_store(policy: str, num_slots: int, future: Iterable[object] = ()) -> ChunkStore:
    """A metadata-only store; Belady gets ``future`` (names) as its access sequence."""
    chosen: str | Policy = policy
    if policy == "belady":
        chosen = Belady(num_slots, future=keys(future))
    return ChunkStore(num_slots, policy=chosen)
