"""Independent, straightforward simulations the replay is checked against."""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Container, Sequence

from kvtier.replay.trace import TraceRequest


def leading_run(hash_ids: Sequence[int], present: Container[int]) -> int:
    """How many of the leading blocks are present, up to the first one that is not."""
    run = 0
    for h in hash_ids:
        if h not in present:
            break
        run += 1
    return run


def simple_lru(requests: Sequence[TraceRequest], capacity: int) -> tuple[int, int]:
    """(block hits, block references): a request hits the longest run of its leading
    blocks present, then all its blocks are inserted or refreshed in order, and the least
    recently used blocks are evicted down to ``capacity``."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = refs = 0
    for r in requests:
        hits += leading_run(r.hash_ids, cache)
        refs += len(r.hash_ids)
        for h in r.hash_ids:
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = None
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits, refs


def simple_infinite(requests: Sequence[TraceRequest]) -> tuple[int, int]:
    """(block hits, block references) with a cache that never evicts."""
    seen: set[int] = set()
    hits = refs = 0
    for r in requests:
        hits += leading_run(r.hash_ids, seen)
        refs += len(r.hash_ids)
        seen.update(r.hash_ids)
    return hits, refs


def simple_lru_admit(
    requests: Sequence[TraceRequest], capacity: int, after: int, window: int
) -> tuple[int, int]:
    """(block hits, block writes) of ``simple_lru`` with admission: a block not cached is
    inserted only if it was offered at least ``after - 1`` times among the last ``window``
    offers before this one (an offer: a reference to a block not cached)."""
    cache: OrderedDict[int, None] = OrderedDict()
    offers: deque[int] = deque()
    counts: Counter[int] = Counter()
    hits = writes = 0
    for r in requests:
        hits += leading_run(r.hash_ids, cache)
        for h in r.hash_ids:
            if h in cache:
                cache.move_to_end(h)
                continue
            admitted = counts[h] >= after - 1
            offers.append(h)
            counts[h] += 1
            if len(offers) > window:
                counts[offers.popleft()] -= 1
            if admitted:
                cache[h] = None
                writes += 1
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits, writes
