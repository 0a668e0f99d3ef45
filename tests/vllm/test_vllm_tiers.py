"""kvtier's connector over the whole hierarchy inside vLLM's real Scheduler: host memory above
a disk directory and a real redis-server, the workers holding the bytes.

Each producer's chunks leave host memory (a three-slot host tier evicts them under
write-back, or a reset drops them under write-through), so the consumer's hit can only come
from below: promoted into host slots while the request waits, then loaded. Restored KV is
compared with what a cold computation writes (``check_restored``).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from vllm_helpers import chunks, metrics, scheduled

from kvtier.integrations.vllm.testing import SimGroup, VllmSim
from kvtier.tiers.disk.directory import record_path
from tiers.tier_helpers import REDIS_SERVER, Clock, RedisServer

pytestmark = pytest.mark.vllm

PROMPT_A = list(range(1000, 1100))  # 100 tokens: chunks 0-2 stored (boundaries 32, 64, 96)
PROMPT_B = list(range(2000, 2100))  # evicts A's chunks from the three-slot host tier
SLOT = 32 * 32  # 32 tokens x (K, V) x 8 values x 2 bytes: one chunk of the one layer
needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not on PATH")


def tier_sim(**tiers: Any) -> tuple[VllmSim, Clock]:
    """A sim whose connector has a three-slot host tier and ``tiers``; the planner's clock
    is a ``Clock`` the test moves (the lookup deadline never passes by itself)."""
    extra = {"chunk_tokens": 32, "host": {"capacity": 3 * SLOT}, **tiers}
    sim = VllmSim([SimGroup("full", 16)], "KvtierConnector", extra)
    clock = Clock()
    sim.scheduler.connector.scheduler.planner.clock = clock
    return sim, clock


def disk(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"path": str(tmp_path / "kv"), "capacity": 64 * SLOT, "fsync": False, **more}


def settle(sim: VllmSim) -> None:
    """Wait for the workers' transfers and tier writes and the scheduler's probes."""
    sim.worker.worker.wait_all()
    sim.worker.worker.tiers.drain()
    sim.scheduler.connector.scheduler.tiers.settle()


def run(sim: VllmSim, max_steps: int = 200) -> None:
    """``sim.run``, settling after each step: a step that only waits on a probe in flight
    is not wasted (the planner's clock stands still, so a request waiting on one would
    otherwise wait for as many steps as the probe's thread takes)."""
    for _ in range(max_steps):
        if not sim.scheduler.has_requests():
            return
        sim.step()
        settle(sim)
    raise AssertionError(f"requests still running after {max_steps} steps")


def produce(sim: VllmSim, *prompts: list[int]) -> None:
    for i, prompt in enumerate(prompts):
        sim.add(f"producer{i}", prompt)
        run(sim)
    sim.reset_device_cache()


def consume(sim: VllmSim, prompt: list[int], max_steps: int = 10) -> tuple[int, int]:
    """Step (settling after each) until the consumer is scheduled: (tokens restored, steps
    before it; a hit from host memory takes none: it loads in the step that schedules the
    request, ``sync_loads``)."""
    sim.add("consumer", prompt)
    for waited in range(max_steps):
        out = sim.step()
        settle(sim)
        if "consumer" in out.num_scheduled_tokens:
            return len(prompt) - scheduled(out, "consumer"), waited
    raise AssertionError(f"consumer not scheduled within {max_steps} steps")


def test_write_back_disk_hit_after_host_eviction(tmp_path: Path) -> None:
    sim, _ = tier_sim(disk=disk(tmp_path))
    produce(sim, PROMPT_A, PROMPT_B)
    hit, waited = consume(sim, PROMPT_A)
    assert (hit, waited) == (96, 1)  # a step promoting from disk; then loaded and computed
    assert sim.check_restored("consumer", 96) == []
    assert chunks(sim, "load", "consumer") == {(0, 0), (0, 1), (0, 2)}
    # negative control: the check sees a restored block that differs from cold KV
    block = sim.scheduler.kv_cache_manager.get_block_ids("consumer")[0][1]
    sim.kv["g0.l0"][block] += 1
    assert sim.check_restored("consumer", 96) != []
    run(sim)
    sim.close()


def test_write_through_disk_hit_without_eviction(tmp_path: Path) -> None:
    sim, _ = tier_sim(disk=disk(tmp_path), write_policy="write-through")
    produce(sim, PROMPT_A)
    stored = [c.key for meta in sim.plans for job in meta.plan.stores for c in job.copies]
    assert len(stored) == 3
    assert all(record_path(tmp_path / "kv" / "rank0", k).exists() for k in stored)
    sim.scheduler.connector.scheduler.clear_cache()  # host memory empty: disk only
    hit, _ = consume(sim, PROMPT_A)
    assert hit == 96 and sim.check_restored("consumer", 96) == []
    run(sim)
    sim.close()


def test_corrupt_disk_record_recomputes(tmp_path: Path) -> None:
    sim, _ = tier_sim(disk=disk(tmp_path))
    produce(sim, PROMPT_A, PROMPT_B)
    a_keys = [c.key for meta in sim.plans for job in meta.plan.stores
              if job.request_id == "producer0" for c in job.copies]
    path = record_path(tmp_path / "kv" / "rank0", a_keys[1])
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF  # a flipped payload byte: the record fails verification
    path.write_bytes(bytes(raw))
    hit, _ = consume(sim, PROMPT_A)
    assert hit == 0  # the failed promotion loaded nothing; the request computes it all
    assert chunks(sim, "load", "consumer") == set()
    assert metrics(sim)["load_failures"] == 0
    run(sim)
    sim.close()


@needs_redis
def test_redis_hit_and_server_killed(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        sim, _ = tier_sim(redis={"url": server.url, "timeout_s": 2.0})
        produce(sim, PROMPT_A, PROMPT_B)
        hit, waited = consume(sim, PROMPT_A)
        # a step promoting (nothing else is scheduled: it waits for the probe, then for the
        # promotion); the load runs in the step that schedules the request
        assert (hit, waited) == (96, 1)
        assert sim.check_restored("consumer", 96) == []
        # the lookup's probes (its last chunk first, then the rest) make one promotion,
        # one read of the server instead of one after the other
        promotions = [p for meta in sim.plans for p in meta.plan.promotes]
        assert [(p.tier, len(p.keys)) for p in promotions] == [("redis", 3)]
        run(sim)
        sim.scheduler.connector.scheduler.clear_cache()
        sim.reset_device_cache()
        server.stop()
        sim.requests.pop("consumer")
        assert consume(sim, PROMPT_A)[0] == 0  # the server is gone: a miss, recomputed
        run(sim)
        sim.close()
    finally:
        server.stop()


@needs_redis
def test_lookup_waits_no_longer_than_the_deadline(tmp_path: Path) -> None:
    """A paused server never answers the probe: the request waits until the planner's clock
    passes ``wait_timeout_s``, then computes everything (a step with nothing scheduled waits
    for the probe no longer than ``IDLE_WAIT_S`` of wall-clock time)."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        sim, clock = tier_sim(redis={"url": server.url, "timeout_s": 30.0},
                              wait_timeout_s=0.05)
        produce(sim, PROMPT_A, PROMPT_B)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        sim.add("consumer", PROMPT_A)
        for _ in range(3):
            assert "consumer" not in sim.step().num_scheduled_tokens  # waiting: probe pending
        clock.now += 0.049
        assert "consumer" not in sim.step().num_scheduled_tokens
        clock.now += 0.002  # past the deadline
        out = sim.step()
        assert scheduled(out, "consumer") == len(PROMPT_A)
        assert metrics(sim)["deadline_expiries"] == 1
        server.proc.send_signal(signal.SIGCONT)
        run(sim)
        sim.close()
    finally:
        server.stop()



def test_disk_chunk_promoted_past_admission(tmp_path: Path) -> None:
    """``admit_after: 2`` holds back a chunk's first offer, but a chunk found on disk is in
    the hierarchy already: promoted (``prepare_store(promote=True)``) and hit at its first
    lookup even when admission no longer remembers it (an ordinary store of it would be a
    first offer again, declined: the request would miss)."""
    sim, _ = tier_sim(disk=disk(tmp_path), write_policy="write-through", admit_after=2,
                      admit_window=3)
    produce(sim, PROMPT_A)
    produce(sim, PROMPT_A)  # the second offer: stored, written through to disk
    produce(sim, PROMPT_B)  # B's first offers fill the window: A's offers are forgotten
    assert metrics(sim)["chunks_not_admitted"] == 6
    stored = {c.key for meta in sim.plans for job in meta.plan.stores for c in job.copies}
    assert len(stored) == 3  # A's, at its second offer; B's were declined
    assert all(record_path(tmp_path / "kv" / "rank0", k).exists() for k in stored)
    sim.scheduler.connector.scheduler.clear_cache()  # host memory empty: disk only
    hit, waited = consume(sim, PROMPT_A)
    assert (hit, waited) == (96, 1)  # a step promoting from disk; then loaded and computed
    assert sim.check_restored("consumer", 96) == []
    assert metrics(sim)["chunks_not_admitted"] == 6  # the promotion was not filtered
    run(sim)
    sim.close()
