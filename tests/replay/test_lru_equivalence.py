"""The replay's LRU equals a plain LRU simulation of the trace's blocks, on the whole
bundled trace: one full-attention group of 512-token chunks, several capacities (each
larger than the largest request, 247 blocks: a smaller store refuses such a request)."""

from __future__ import annotations

import pytest
from oracles import simple_lru

from kvtier.layout import Group, Layout
from kvtier.replay import ReplayConfig, Workload, read_trace, replay


@pytest.fixture(scope="module")
def workload() -> Workload:
    return Workload(read_trace(), ReplayConfig(Layout((Group("full", 512),))))


@pytest.mark.slow
@pytest.mark.parametrize("capacity", [1000, 3000, 10000])
def test_block_hit_rate_equals_plain_lru(workload: Workload, capacity: int) -> None:
    stats = replay(workload, "lru", capacity)
    hits, refs = simple_lru(workload.requests, capacity)
    assert (stats.block_hits, stats.block_refs) == (hits, refs)
    assert stats.block_hit_rate == hits / refs
    assert stats.requests == 12031
    assert stats.store_refusals == 0
