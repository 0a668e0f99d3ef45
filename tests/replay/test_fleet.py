"""Fleet replay (``kvtier.replay.fleet``): a fleet of one is the single-engine replay, the
routers do what they promise, the shared tier serves every engine."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvtier.layout import Group, Layout
from kvtier.replay import ReplayConfig, TraceRequest, Workload, replay
from kvtier.replay.concurrent import replay_concurrent
from kvtier.replay.fleet import FleetOptions, replay_fleet
from kvtier.replay.routers import ROUTERS, parse_router
from kvtier.replay.synth import SynthConfig, generate

BLOCK = 64
FULL = Layout((Group("full", BLOCK, bytes_per_token=16),))
HYBRID = Layout((Group("full", BLOCK, bytes_per_token=16),
                 Group("sliding_window", 32, window=48, bytes_per_token=16)))


def synthetic(seed: int, **kw: Any) -> list[TraceRequest]:
    spec = {"users": 12, "turns": 3, "system_prompts": 2, "system_tokens": 4 * BLOCK,
            "user_tokens": 3 * BLOCK, "output_tokens": 2 * BLOCK, "think_time_s": 5.0,
            "arrival_rate_per_s": 2.0, "seed": seed, **kw}
    return generate(SynthConfig(**spec), BLOCK)


def workload(reqs: list[TraceRequest], layout: Layout = FULL) -> Workload:
    return Workload(reqs, ReplayConfig(layout, block_tokens=BLOCK))


def fleet(w: Workload, instances: int, router: str, host: int, **kw: Any) -> Any:
    options = FleetOptions(instances, parse_router(router), **kw)
    return replay_fleet(w, "lru", host, options=options)


def figures(stats: Any) -> dict[str, Any]:
    d = stats.as_dict()
    d.pop("wall_s")
    return d


@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize("concurrent", [False, True])
def test_one_instance_is_the_single_engine_replay(router: str, concurrent: bool) -> None:
    w = workload(synthetic(1), HYBRID)
    single = (replay_concurrent if concurrent else replay)(w, "lru", 40, 30)
    options = FleetOptions(1, parse_router(router), concurrent=concurrent)
    one = replay_fleet(w, "lru", 40, 30, options=options)
    assert single.hit_tokens > 0 and single.chunks_loaded_by_tier.get("disk")
    assert figures(one.engines[0]) == figures(single)
    assert one.token_hit_rate == single.token_hit_rate
    assert one.ttft()["ttft_s"]["p90"] > 0 and set(one.assignment) == {0}


def repeating_trace(seed: int, n: int = 60) -> list[TraceRequest]:
    """Every request after the first few repeats a prefix of an earlier one, then adds its own
    blocks."""
    rng = random.Random(seed)
    next_id, out = 0, []
    for i in range(n):
        if i < 3:
            head: tuple[int, ...] = ()
        else:
            earlier = rng.choice(out).hash_ids
            head = earlier[: rng.randint(1, len(earlier))]
        tail = tuple(range(next_id, next_id + rng.randint(1, 4)))
        next_id += len(tail)
        ids = head + tail
        out.append(TraceRequest(float(i), len(ids) * BLOCK, 8, ids))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("router", ["prefix", "prefix:balance=0"])
def test_prefix_never_worse_than_round_robin_when_prefixes_repeat(seed: int, router: str) -> None:
    w = workload(repeating_trace(seed))
    rr = fleet(w, 4, "round_robin", 10_000)
    kv = fleet(w, 4, router, 10_000)
    assert kv.total("hit_tokens") >= rr.total("hit_tokens")
    assert kv.token_hit_rate > 0


def test_prefix_with_balance_zero_gets_every_prefix_the_fleet_holds() -> None:
    """With room for everything, a request always finds its longest earlier prefix: the same
    hit as one engine holding everything."""
    w = workload(repeating_trace(7))
    assert fleet(w, 4, "prefix:balance=0", 10_000).total("hit_tokens") == replay(
        w, "lru", 10_000).hit_tokens


def test_session_is_sticky_by_conversation() -> None:
    reqs = synthetic(3, users=30, user_tokens=6 * BLOCK)
    w = workload(reqs)
    sessions = fleet(w, 4, "session", 10_000)
    rr = fleet(w, 4, "round_robin", 10_000)

    def engines_per_conversation(assignment: list[int]) -> list[int]:
        by_user: dict[int, set[int]] = {}
        for r, e in list(zip(reqs, assignment, strict=True))[8:]:  # the system prompts known
            by_user.setdefault(r.hash_ids[4], set()).add(e)  # its first block past them
        return [len(s) for s in by_user.values()]

    assert set(engines_per_conversation(sessions.assignment)) == {1}
    assert max(engines_per_conversation(rr.assignment)) > 1  # the control spreads them
    assert len(set(sessions.assignment)) == 4


def test_least_loaded_balances_prefill_tokens() -> None:
    reqs = synthetic(5, users=40)
    stats = fleet(workload(reqs), 4, "least_loaded", 200)
    prefill = [s.prompt_tokens - s.hit_tokens for s in stats.engines]
    mean = sum(prefill) / 4
    assert max(prefill) <= mean + max(r.input_length for r in reqs)  # greedy's bound
    assert stats.imbalance()["prefill_tokens"] == max(prefill) / mean
    rr = fleet(workload(reqs), 4, "round_robin", 200)
    assert stats.imbalance()["prefill_tokens"] <= rr.imbalance()["prefill_tokens"]


def test_shared_tier_serves_what_another_engine_stored() -> None:
    w = workload(synthetic(2))
    alone = fleet(w, 4, "round_robin", 8)
    shared = fleet(w, 4, "round_robin", 8, shared_slots=10_000)
    assert not alone.by_tier("chunks").get("shared")
    assert shared.by_tier("chunks")["shared"] > 0
    assert shared.total("hit_tokens") > alone.total("hit_tokens")
    slow = ReplayConfig(FULL, block_tokens=BLOCK, timing=shared_timing(1e-3))
    slower = replay_fleet(Workload(w.requests, slow), "lru", 8, options=FleetOptions(
        4, parse_router("round_robin"), shared_slots=10_000))
    assert slower.ttft()["ttft_s"]["p99"] > shared.ttft()["ttft_s"]["p99"]


def shared_timing(gb_per_s: float) -> Any:
    from kvtier.replay.timing import TimingModel

    return TimingModel(shared_gb_per_s=gb_per_s)


def test_bad_options_are_value_errors() -> None:
    with pytest.raises(ValueError, match="--instances"):
        FleetOptions(0)
    with pytest.raises(ValueError, match="balance"):
        parse_router("prefix:balance=nan")
    with pytest.raises(ValueError, match="belady"):
        replay_fleet(workload(synthetic(1)), "belady", 10, options=FleetOptions(2))
