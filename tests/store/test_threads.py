"""The one lock: several threads hammer a shared store; the invariants hold throughout."""

from __future__ import annotations

import random
import threading

import pytest
from store_helpers import keys

from kvtier.store import POLICIES, ChunkStore, StoreHandle, make_policy

NAMES = [f"k{i}" for i in range(40)]
NUM_THREADS, NUM_OPS = 4, 600


def worker(store: ChunkStore, seed: int, start: threading.Barrier, errors: list) -> None:
    rng = random.Random(seed)
    start.wait()
    try:
        for i in range(NUM_OPS):
            step(store, rng, keys(rng.sample(NAMES, rng.randint(1, 4))))
            if i % 50 == 0:
                store.check_invariants()
    except Exception as e:  # reported to the main thread, which fails the test
        errors.append(e)


def step(store: ChunkStore, rng: random.Random, ks: list) -> None:
    op = rng.random()
    if op < 0.45:
        handle = store.prepare_store(ks)
        if isinstance(handle, StoreHandle):
            store.complete_store(handle, ok=rng.random() < 0.9)
    elif op < 0.8:
        with store.lock:  # lookup and pin atomically
            ready = [k for k, s in zip(ks, store.lookup(ks), strict=True) if s.readable]
            load = store.prepare_load(ready)
        store.complete_load(load)
    elif op < 0.95:
        store.touch(ks)
    else:
        store.remove(ks)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_concurrent_callers_keep_the_invariants(name: str) -> None:
    capacity = 12
    policy = make_policy(name, capacity, **({"future": keys(NAMES)} if name == "belady" else {}))
    store = ChunkStore(capacity, policy=policy)
    start, errors = threading.Barrier(NUM_THREADS), []
    threads = [
        threading.Thread(target=worker, args=(store, seed, start, errors))
        for seed in range(NUM_THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store.check_invariants()
    assert store.num_pinned == 0 and store.num_writing == 0
    assert store.num_ready + store.num_free == capacity
