"""The replay over a prefix of the bundled trace: policies, ceilings, tiers, layouts."""

from __future__ import annotations

import pytest
from oracles import simple_infinite

from kvtier.keys import ChunkKey
from kvtier.layout import Group, Layout
from kvtier.presets import preset
from kvtier.replay import ReplayConfig, TimingModel, Workload, read_trace, replay
from kvtier.replay.concurrent import replay_concurrent
from kvtier.replay.metadata import metadata_store
from kvtier.replay.policies import compared_policies
from kvtier.replay.synth import SynthConfig, generate
from kvtier.store import LRU, POLICIES, StoreHandle

FULL_512 = Layout((Group("full", 512),))
PREFIX = 800


@pytest.fixture(scope="module")
def requests() -> list:
    return read_trace(limit=PREFIX)


@pytest.fixture(scope="module")
def full(requests: list) -> Workload:
    return Workload(requests, ReplayConfig(FULL_512))


def test_every_policy_sits_between_nothing_and_the_ceilings(full: Workload) -> None:
    rates = {p: replay(full, p, 1500) for p in compared_policies()}
    hits, refs = simple_infinite(full.requests)
    assert rates["infinite"].block_hits == hits
    for p, s in rates.items():
        assert 0 < s.block_hit_rate <= rates["belady"].block_hit_rate or p == "infinite"
        assert s.block_hit_rate <= rates["infinite"].block_hit_rate
        assert s.block_refs == refs and s.requests == PREFIX


def test_new_registered_policies_are_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    class Newest(LRU):
        name = "newest"

    monkeypatch.setitem(POLICIES, "newest", Newest)
    names = compared_policies()
    assert names[0] == "lru" and "newest" in names and names[-2:] == ["belady", "infinite"]


def test_token_hits_are_whole_chunks_below_the_prompt_end(full: Workload) -> None:
    s = replay(full, "lru", 2000)
    assert s.hit_tokens % 512 == 0
    assert s.hit_tokens <= s.block_hits * 512
    assert 0 < s.token_hit_rate < 1
    assert s.ttft_s < s.ttft_cold_s


def test_prompt_scope_stores_no_partial_block(requests: list) -> None:
    blocks = replay(Workload(requests, ReplayConfig(FULL_512)), "infinite", 1)
    prompt = replay(Workload(requests, ReplayConfig(FULL_512, scope="prompt")), "infinite", 1)
    assert prompt.groups[0].offered == sum(r.input_length // 512 for r in requests)
    assert prompt.block_hits <= blocks.block_hits


def test_sequential_concurrent_with_one_prefill_slot_agree(full: Workload) -> None:
    seq = replay(full, "lru", 1500)
    conc = replay_concurrent(full, "lru", 1500)
    assert (conc.block_hits, conc.hit_tokens) == (seq.block_hits, seq.hit_tokens)
    assert conc.ttft_s >= seq.ttft_s  # queueing only adds


def test_concurrent_prefills_can_miss_a_prefix_still_being_computed(requests: list) -> None:
    timing = TimingModel(prefill_slots=8, prefill_tokens_per_s=500)
    w = Workload(requests[:300], ReplayConfig(FULL_512, timing=timing))
    assert replay_concurrent(w, "infinite", 1).block_hits < replay(w, "infinite", 1).block_hits


def test_disk_tier_below_host(full: Workload) -> None:
    host_only = replay(full, "lru", 500)
    tiered = replay(full, "lru", 500, disk_slots=20000)
    assert tiered.block_hits >= host_only.block_hits
    assert tiered.chunks_loaded_by_tier.get("disk", 0) > 0
    assert tiered.slots == {"host": 500, "disk": 20000}
    assert tiered.block_hits <= simple_infinite(full.requests)[0]


def test_the_disk_model_never_waits_and_repeats_itself(full: Workload) -> None:
    first, again = (replay(full, "lru", 300, disk_slots=600) for _ in range(2))
    assert first.waits == 0 and first.chunks_loaded_by_tier.get("disk", 0) > 0
    assert first.as_dict() | {"wall_s": 0} == again.as_dict() | {"wall_s": 0}


def test_the_store_locates_holds_and_refreshes_without_promoting() -> None:
    a, b, c, d, e = (ChunkKey(bytes([i]) * 40) for i in range(5))
    store = metadata_store(2, disk_slots=2)

    def put(*ks: ChunkKey) -> None:
        for k in ks:
            handle = store.prepare_store([k])
            assert isinstance(handle, StoreHandle) and handle.keys == (k,)
            store.complete_store(handle, ok=True)

    put(a, b, c)  # a is written down to disk
    assert store.locate([a, b, c, d]) == ["disk", "host", "host", ""]
    held = store.hold([a, b])  # b pinned in host memory, a used where it is
    assert held is not None and held.keys == (b,)
    put(d)  # evicts c, not the pinned b; disk: a, c
    store.complete_load(held)
    store.refresh([a])  # a is now the disk's most recent
    put(e)  # evicts d (b's release was a use) to disk, which evicts its least recent: c
    assert store.locate([a, b, c, d, e]) == ["disk", "host", "", "disk", "host"]
    assert store.promoted == {} and store.tier_slots() == {"host": 2, "disk": 2}
    store.check_invariants()


def test_holding_with_places_for_other_keys_is_refused_and_changes_nothing() -> None:
    a, b = (ChunkKey(bytes([i]) * 40) for i in range(2))
    store = metadata_store(2)
    for k in (a, b):
        handle = store.prepare_store([k])
        assert isinstance(handle, StoreHandle)
        store.complete_store(handle, ok=True)
    with pytest.raises(ValueError, match="1 places for 2 keys"):
        store.hold([a, b], ["host"])
    held = store.hold([a, b], ["host", "host"])  # the same call, one place each
    assert held is not None and held.keys == (a, b)
    store.complete_load(held)
    store.check_invariants()


def test_hybrid_layout_loads_only_the_window(requests: list) -> None:
    w = Workload(requests[:250], ReplayConfig(preset("gpt-oss-120b")))
    s = replay(w, "lru", 3000)
    full, sliding = s.groups
    assert full.loaded > 0 and sliding.loaded < full.loaded
    assert sliding.offered <= sliding.dense
    per = preset("gpt-oss-120b").groups[0].bytes_per_chunk
    assert per is not None and s.as_dict()["groups"][0]["loaded_bytes"] == full.loaded * per


def test_synthetic_traces_are_deterministic_and_share_system_prompts() -> None:
    cfg = SynthConfig(users=40, turns=4, system_prompts=2, seed=7)
    a, b = generate(cfg), generate(cfg)
    assert a == b and a != generate(SynthConfig(users=40, turns=4, system_prompts=2, seed=8))
    assert len({r.hash_ids[0] for r in a}) == 2
    assert [r.timestamp_ms for r in a] == sorted(r.timestamp_ms for r in a)
    s = replay(Workload(a, ReplayConfig(FULL_512)), "infinite", 1)
    assert s.block_hit_rate > 0.5  # system prompts and histories are reused


def test_timing_model() -> None:
    m = TimingModel(prefill_tokens_per_s=1000, host_gb_per_s=1, load_latency_ms=0,
                    first_token_ms=0)
    assert m.ttft_s(2000, 0, {}) == 2.0
    assert m.ttft_s(2000, 1000, {"host": 10**8}) == pytest.approx(1.1)
    with pytest.raises(ValueError, match="prefill_tokens_per_s must be > 0"):
        TimingModel(prefill_tokens_per_s=0)
    with pytest.raises(ValueError, match="among"):
        TimingModel.parse("speed=3")


def test_timing_model_times_each_tier_at_its_own_rate() -> None:
    """A load is timed per tier: host, disk and a fleet's shared tier at their bandwidths,
    any other tier (Redis with ``--bytes``) at the disk's; a fixed latency per tier read,
    the shared tier's its own; a tier that gave no bytes costs nothing."""
    m = TimingModel(prefill_tokens_per_s=1000, host_gb_per_s=2, disk_gb_per_s=0.5,
                    shared_gb_per_s=1, load_latency_ms=3, shared_latency_ms=7,
                    first_token_ms=10)
    gb = 10**9
    assert m.load_s({"host": gb}) == pytest.approx(0.5 + 0.003)
    assert m.load_s({"disk": gb, "host": 0}) == pytest.approx(2 + 0.003)
    assert m.load_s({"redis": gb}) == pytest.approx(2 + 0.003)
    assert m.load_s({"shared": gb}) == pytest.approx(1 + 0.007)
    assert m.load_s({"host": gb, "shared": gb}) == pytest.approx(0.503 + 1.007)
    assert m.ttft_s(3000, 1000, {"host": gb}) == pytest.approx(0.503 + 2 + 0.01)
    arithmetic = m.arithmetic()  # what a replay asks per request: the same numbers
    for by_tier in ({}, {"host": gb}, {"disk": 123, "shared": 456789, "redis": 5}):
        assert arithmetic.ttft_s(3000, 700, by_tier) == m.ttft_s(3000, 700, by_tier)
    assert m.ttft_s(3000, 700, {"disk": gb}) != m.ttft_s(3000, 700, {"host": gb})
