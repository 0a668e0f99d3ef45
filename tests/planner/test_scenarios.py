"""Planner scenarios with exact chunk indices; jobs complete only when the test says so."""

from __future__ import annotations

import pytest
from harness import Harness, loaded

from kvtier.layout import Group, Layout
from kvtier.planner import Outcome, RequestLimits


def seed_layout(extra: int) -> Layout:
    return Layout((Group("full", 16), Group("sliding_window", 16, window=32, extra_retained=extra)))


@pytest.mark.parametrize(("extra", "swa_chunks"), [(0, [2, 3]), (1, [2, 3]), (3, [1, 2, 3])])
def test_producer_then_cold_consumer_hits_64(extra: int, swa_chunks: list[int]):
    h = Harness(seed_layout(extra))
    prompt = list(range(65))
    store_job = h.produce("p", prompt, complete=False)
    assert store_job is not None
    assert loaded(store_job) == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}
    h.planner.complete_store(store_job.id, True)
    h.planner.add_request("c", prompt)
    hit = h.planner.lookup("c")
    assert (hit.outcome, hit.hit_tokens) == (Outcome.HIT, 64)
    job = h.planner.accept_hit("c", h.table(65, upto_position=64))
    assert loaded(job) == {0: [0, 1, 2, 3], 1: swa_chunks}
    result = h.planner.complete_load(job.id, True)
    assert result is not None and result.ok and result.valid_tokens == 64


def test_full_plus_small_sliding_chunks_design_example():
    layout = Layout((Group("full", 16), Group("sliding_window", 4, window=8, extra_retained=3)))
    h = Harness(layout)
    job = h.produce("p", list(range(33)), complete=False)
    assert loaded(job) == {0: [0, 1], 1: [1, 2, 3, 5, 6, 7]}
    h.planner.complete_store(job.id, True)
    h.planner.add_request("c", list(range(33)))
    assert h.planner.lookup("c").hit_tokens == 32
    load = h.planner.accept_hit("c", h.table(33, upto_position=32))
    assert loaded(load) == {0: [0, 1], 1: [5, 6, 7]}
    # chunk 5 covers tokens 20..23; retained starts at 22: only its block (one block/chunk)
    assert [c.first_block for c in load.copies if c.group == 1] == [0, 0, 0]


def test_draft_group_with_lookahead():
    layout = Layout((Group("full", 16), Group("full", 16, lookahead=1, name="eagle")))
    h = Harness(layout)
    job = h.produce("p", list(range(64)), complete=False)
    # with 64 tokens a producer serves 48 at most: the draft chunk 3 needs token 64
    assert loaded(job) == {0: [0, 1, 2], 1: [0, 1, 2]}
    h.planner.complete_store(job.id, True)
    h.planner.add_request("c", list(range(80)))
    assert h.planner.lookup("c").hit_tokens == 48


def test_chunked_local_and_block_sizes_per_group():
    layout = Layout((Group("full", 8, 2), Group("chunked_local", 4, 2, chunk=24)))
    h = Harness(layout)
    job = h.produce("p", list(range(50)), complete=False)
    # boundaries 16, 32, 48 and their whole-prompt hits 15, 31, 47: local retains [0,16),
    # [24,32), [48,48) and [0,15), [24,31), [24,47) -> chunks 0, 1 and 3, 4, 5
    assert loaded(job) == {0: [0, 1, 2], 1: [0, 1, 3, 4, 5]}
    h.planner.complete_store(job.id, True)
    h.planner.add_request("c", list(range(50)))
    assert h.planner.lookup("c").hit_tokens == 48
    load = h.planner.accept_hit("c", h.table(50, upto_position=48))
    assert loaded(load) == {0: [0, 1, 2]}  # chunked local keeps nothing at 48


def test_consumer_sharing_part_of_the_prefix():
    h = Harness(seed_layout(3))
    h.produce("p", list(range(100)))
    h.planner.add_request("c", [*range(40), 7, *range(41, 100)])
    hit = h.planner.lookup("c")
    assert hit.hit_tokens == 32
    assert loaded(h.planner.accept_hit("c", h.table(100, 32))) == {0: [0, 1], 1: [0, 1]}


def test_chunk_still_being_written_waits_then_hits():
    h = Harness(seed_layout(0))
    job = h.produce("p", list(range(65)), complete=False)
    h.planner.add_request("c", list(range(65)))
    first = h.planner.lookup("c")
    assert first.outcome is Outcome.WAIT and first.wait_until == 1.0
    h.planner.complete_store(job.id, True)
    assert h.planner.lookup("c").hit_tokens == 64
    assert h.planner.metrics.waits == 1


def test_expired_deadline_takes_largest_ready_hit():
    h = Harness(seed_layout(0))
    h.produce("p1", list(range(33)))  # chunks up to boundary 32 ready
    h.produce("p2", list(range(65)), complete=False)  # 48 and 64 still writing
    h.planner.add_request("c", list(range(65)))
    assert h.planner.lookup("c").outcome is Outcome.WAIT
    h.clock.now = 0.5
    assert h.planner.lookup("c").outcome is Outcome.WAIT
    h.clock.now = 1.0
    hit = h.planner.lookup("c")
    assert (hit.outcome, hit.hit_tokens) == (Outcome.HIT, 32)
    assert h.planner.metrics.deadline_expiries == 1


def test_missing_middle_chunk_caps_the_hit():
    h = Harness(seed_layout(0))
    h.produce("p", list(range(129)))
    chain_keys = h.planner  # the store is the source of truth: drop full chunk 3
    del chain_keys
    from kvtier.keys import KeyChain, Namespace

    key = KeyChain(h.layout, Namespace("test"), range(129)).key(0, 3)
    assert h.store.remove([key]) == [key]
    h.planner.add_request("c", list(range(129)))
    assert h.planner.lookup("c").hit_tokens == 48


def test_two_consumers_of_one_prefix_load_it_once():
    h = Harness(seed_layout(0))
    h.produce("p", list(range(65)))
    for rid in ("a", "b"):
        h.planner.add_request(rid, list(range(65)))
    assert h.planner.lookup("a").hit_tokens == 64
    job = h.planner.accept_hit("a", h.table(65, 64))
    assert h.planner.lookup("b").outcome is Outcome.WAIT  # a is loading those chunks
    h.planner.complete_load(job.id, True)
    # the engine now holds a's blocks; b's engine-side prefix hit covers 64 tokens
    assert h.planner.lookup("b", on_device=64).outcome is Outcome.MISS


def test_abort_during_load_unpins_on_completion():
    h = Harness(seed_layout(0))
    h.produce("p", list(range(65)))
    h.planner.add_request("c", list(range(65)))
    h.planner.lookup("c")
    job = h.planner.accept_hit("c", h.table(65, 64))
    h.planner.abort("c")
    assert h.store.num_pinned > 0
    h.planner.complete_load(job.id, True)
    assert h.store.num_pinned == 0
    h.planner.check_quiescent()
    h.store.check_invariants()


def test_preemption_with_stores_in_flight_keeps_fences():
    h = Harness(seed_layout(0))
    h.planner.add_request("p", list(range(65)))
    table = h.table(65)
    job = h.planner.on_computed("p", 65, table)
    assert job is not None
    h.planner.preempt("p")
    full_blocks = [b for b in table[0] if b is not None]
    assert h.planner.fence(0, full_blocks) == [job.id]
    h.planner.complete_store(job.id, True)
    assert h.planner.fence(0, full_blocks) == []
    # running again, nothing new needs storing: the chunks are there
    assert h.planner.on_computed("p", 65, h.table(65)) is None
    h.planner.finish("p")
    h.planner.check_quiescent()


def test_failed_load_rolls_back_and_drops_corrupt_chunk():
    h = Harness(seed_layout(0))
    h.produce("p", list(range(65)))
    h.planner.add_request("c", list(range(65)))
    h.planner.lookup("c", on_device=16)
    job = h.planner.accept_hit("c", h.table(65, 64))
    bad = job.copies[0].key
    result = h.planner.complete_load(job.id, False, corrupt=[bad])
    assert result is not None and not result.ok and result.valid_tokens == 16
    assert h.planner.metrics.corrupt_chunks_dropped == 1
    assert h.store.lookup([bad])[0].value == "absent"


def test_store_refused_when_full_is_retried_without_waiting():
    h = Harness(seed_layout(0), num_slots=10)
    h.planner.add_request("a", list(range(65)))
    job = h.planner.on_computed("a", 32, h.table(65))  # 4 chunks, still being written
    assert job is not None and len(job.copies) == 4
    # b needs 8 slots: 6 are free and writing chunks cannot be evicted: refused, retryable
    h.planner.add_request("b", list(range(200, 265)))
    assert h.planner.on_computed("b", 65, h.table(65)) is None
    assert h.planner.metrics.store_refusals == 1
    h.planner.complete_store(job.id, True)
    retry = h.planner.on_computed("b", 65, h.table(65))
    assert retry is not None and len(retry.copies) == 8  # two of a's chunks evicted
    h.planner.complete_store(retry.id, True)
    h.store.check_invariants()
    assert len(h.store) == 10


def test_prompt_only_limit_and_max_load():
    h = Harness(seed_layout(0))
    h.planner.add_request("p", list(range(33)), limits=RequestLimits(store="prompt"))
    h.planner.append_tokens("p", range(33, 80))
    job = h.planner.on_computed("p", 80, h.table(80))
    assert loaded(job) == {0: [0, 1], 1: [0, 1]}
    h.planner.complete_store(job.id, True)
    h.planner.add_request("c", list(range(80)), limits=RequestLimits(max_load_tokens=16))
    assert h.planner.lookup("c").hit_tokens == 16


def test_bad_calls():
    h = Harness(seed_layout(0))
    with pytest.raises(ValueError, match="unknown request"):
        h.planner.lookup("nope")
    h.planner.add_request("a", [1, 2, 3])
    with pytest.raises(ValueError, match="already registered"):
        h.planner.add_request("a", [1])
    with pytest.raises(ValueError, match="empty prompt"):
        h.planner.add_request("e", [])
    with pytest.raises(ValueError, match="past the 3 tokens"):
        h.planner.on_computed("a", 10, h.table(10))
    with pytest.raises(ValueError, match="no hit waiting"):
        h.planner.accept_hit("a", h.table(3))
    with pytest.raises(ValueError, match="no store job 99"):
        h.planner.complete_store(99, True)
    with pytest.raises(ValueError, match="max_load_tokens"):
        RequestLimits(max_load_tokens=-1)
    h.produce("p", list(range(65)))
    h.planner.add_request("c", list(range(65)))
    h.planner.lookup("c")
    with pytest.raises(ValueError, match="no block allocated"):
        h.planner.accept_hit("c", [[], []])


def test_planner_drives_any_store_of_the_protocol(tmp_path):
    from kvtier.store import ChunkStore
    from kvtier.store.protocol import StoreProtocol
    from kvtier.tiers.config import DiskConfig, HostConfig, TierConfig
    from kvtier.tiers.tiered import TieredStore

    layout = Layout((Group("full", 16, bytes_per_token=4),))
    assert isinstance(ChunkStore(4), StoreProtocol)
    cfg = TierConfig(host=HostConfig(capacity="4KiB"),
                     disk=DiskConfig(path=str(tmp_path), capacity="1MiB"))
    with TieredStore.from_config(cfg, layout) as tiered:
        assert isinstance(tiered, StoreProtocol)


def test_stores_hint_each_full_attention_chunk_s_predecessor():
    """Prefix-aware policies learn that a full-attention chunk is useless without the one
    before it; sliding-window chunks carry no such hint."""
    from kvtier.keys import KeyChain, Namespace
    from kvtier.store import LRU, ChunkStore

    seen: list[tuple[bytes, bytes | None]] = []

    class Recording(LRU):
        def on_insert_with_parents(self, keys, parents):
            seen.extend(zip(keys, parents or [None] * len(keys), strict=True))
            super().on_insert_with_parents(keys, parents)

    layout = seed_layout(0)
    h = Harness(layout)
    h.store = ChunkStore(100, policy=Recording(100))
    from kvtier.planner import Planner

    h.planner = Planner(layout, h.store, Namespace("test"), clock=h.clock)
    h.produce("p", list(range(65)))
    chain = KeyChain(layout, Namespace("test"), range(65))
    hints = dict(seen)
    assert hints[chain.key(0, 0)] is None
    assert hints[chain.key(0, 3)] == chain.key(0, 2)
    assert all(hints[chain.key(1, c)] is None for c in range(4))
