"""The tiny Qwen3-Next of ``test_engine_hybrid`` (1152-token chunks of gated-delta-net state
and full attention) on engines of their own, one after the other (a process holds one KV
connector at a time): preemption in a small KV pool, and state chunks below host memory.

Six requests that do not fit together in 14 blocks are preempted while they decode, and
their tokens equal the same batch's on an engine without a connector.

An engine restarted on a disk directory hits the state and attention chunks from disk; a
state record whose payload changed on disk fails its checksum and is recomputed; a separate
process with an empty host tier hits from a three-master Redis Cluster another process
wrote. Tokens are compared with the cold run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_env import ENGINE_MISSING

if ENGINE_MISSING is not None:
    pytest.skip(ENGINE_MISSING, allow_module_level=True)

import tiny_models
from engine_helpers import Output, tokens
from test_engine_hybrid import BLOCK, HYBRID, MAX_LEN, hybrid_engine

from redis_cluster import LocalRedisCluster

pytestmark = pytest.mark.vllm_engine

PROMPT = tokens(4, 2 * BLOCK + 1)  # stored: the state at 2304 and two attention chunks
STATE_BYTES = 2 * (3 * 1024 * 2 + 4 * 128 * 128 * 4)
"""A state chunk's payload: two layers' conv and delta-net states (attention: 589824)."""
WAIT = 5.0


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.qwen3next(tmp_path_factory.mktemp("hybrid_tiers") / "qwen3next")


BLOCK_BYTES = 2 * 294912
"""One block id's bytes: a 294912-byte page in each of the two KV tensors (a delta-net
layer and a full-attention layer share each tensor's pages)."""


def _together(model: Path, prompts: list[list[int]], connector: bool
              ) -> tuple[list[Output], float, int]:
    """The prompts in one batch on a 14-block engine: outputs, vLLM's preemptions, and the
    tokens kvtier restored (0 without a connector)."""
    eng = hybrid_engine(model, connector=connector, kv_bytes=14 * BLOCK_BYTES)
    try:
        outs = eng.generate(prompts, 100)
        restored = (eng.scheduler.connector.scheduler.planner.metrics.hit_tokens
                    if connector else 0)
        return outs, eng.counter("vllm:num_preemptions"), restored
    finally:
        eng.close()


def test_preemption_mid_generation(model: Path, record_property: Any) -> None:
    """This CPU build's hybrid kernels are not batch-invariant (the same requests run two at
    a time give other greedy tokens, with or without a connector), so the reference is the
    same batch on the same pool without a connector: preempted alike, tokens identical."""
    prompts = [tokens(40 + i, 2250) for i in range(6)]  # states at 1152; decoding crosses 2304
    reference, _, _ = _together(model, prompts, connector=False)
    together, preemptions, restored = _together(model, prompts, connector=True)
    assert preemptions > 0  # the scenario happened
    assert [t.tokens for t in together] == [r.tokens for r in reference]
    record_property("tokens_restored_by_kvtier", restored)


def generate(model: Path, **options: Any) -> Output:
    """PROMPT on a fresh engine (in this process; the previous one closed)."""
    eng = hybrid_engine(model, **options)
    try:
        return eng.generate([PROMPT])[0]
    finally:
        eng.close()


def test_disk_restart_hit_and_a_corrupted_state_record_is_recomputed(
        model: Path, tmp_path: Path) -> None:
    disk = {"path": str(tmp_path / "kv"), "capacity": "1GiB", "fsync": False}
    opts = {"host": {"capacity": "64MiB"}, "disk": disk, "write_policy": "write-through",
            "wait_timeout_s": WAIT}
    cold = generate(model, **opts)
    restarted = generate(model, **opts)
    assert (restarted.tokens, restarted.num_cached) == (cold.tokens, 2 * BLOCK)
    records = [p for p in (tmp_path / "kv").rglob("*") if p.is_file()
               and STATE_BYTES < p.stat().st_size < STATE_BYTES + 4096]
    assert len(records) == 1  # the state at 2304 (attention records are larger)
    raw = bytearray(records[0].read_bytes())
    raw[-100] ^= 0x01  # one bit of the delta-net state
    records[0].write_bytes(bytes(raw))
    recomputed = generate(model, **opts)
    assert (recomputed.tokens, recomputed.num_cached) == (cold.tokens, 0)


def run_child(model: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """PROMPT in a separate engine process (``tier_engine_child``)."""
    spec = json.dumps({"prompt": PROMPT, "extra": {"chunk_tokens": None, **extra},
                       "llm_args": HYBRID, "max_model_len": MAX_LEN, "num_blocks": 0})
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "tier_engine_child.py"),
                           str(model), spec], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.redis
def test_cross_process_hit_from_a_redis_cluster(
        model: Path, redis_cluster: LocalRedisCluster) -> None:
    redis = {"cluster_nodes": redis_cluster.startup_nodes, "namespace": "kvtier-hybrid",
             "timeout_s": 0.5}
    host = {"capacity": "64MiB"}
    a = run_child(model, {"host": host, "redis": redis, "write_policy": "write-through"})
    assert a["num_cached"] == 0 and a["promoted"] == {}
    b = run_child(model, {"host": host, "redis": redis, "wait_timeout_s": WAIT})
    assert (b["tokens"], b["num_cached"]) == (a["tokens"], 2 * BLOCK)
    assert b["promoted"] == {"redis": 3}  # the state at 2304 and two attention chunks
