"""The whole hierarchy on the real vLLM engine: host memory, a disk directory and a real
three-master Redis Cluster, with real forward passes on a tiny Llama.

Engine A generates a prompt cold and writes its chunks through to disk and the cluster;
engine B, a separate process with an empty host tier and the same cluster, generates it
warm, promoted from the cluster; an engine restarted on A's disk directory hits from disk;
with one master of the cluster killed an engine still answers identically, hitting the
chunks before the first one that master held, and its first token comes within the lookup's
deadline. Tokens are compared with A's cold run. (A single Redis server is covered by the
simulator's tests, tests/vllm/test_vllm_tiers.py.)
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
from engine_helpers import CHUNK_TOKENS, tokens

from redis_cluster import LocalRedisCluster

pytestmark = [pytest.mark.vllm_engine, pytest.mark.redis]

PROMPT = tokens(19, 4 * CHUNK_TOKENS + 44)  # chunks 0-3 stored: a warm hit of 512 tokens
HOST = {"capacity": "64MiB"}
NAMESPACE = "kvtier-engine"
WAIT = 5.0
"""``wait_timeout_s`` of the warm engines: a bound, generous for a promotion on a busy CI
machine (a dead master answers at once, so no request waits it out)."""
ENGINE_MARGIN_S = 20.0
"""What a busy CI machine may add to a first token beyond the lookup's deadline (a cold
prefill of this prompt takes well under a second)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.llama(tmp_path_factory.mktemp("tiers") / "llama")


def run_child(model: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Generate PROMPT in a separate engine process (one at a time: each a fresh process,
    as a restarted server is): its tokens, tokens not computed, time to first token, chunks
    promoted by tier, and the keys of the prompt's chunks."""
    spec = json.dumps({"prompt": PROMPT, "extra": extra})
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "tier_engine_child.py"),
                           str(model), spec], capture_output=True, text=True, timeout=240,
                          cwd=Path(__file__).parent, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def partial_victim(cluster: LocalRedisCluster, names: list[str]) -> tuple[int, int]:
    """(the master to kill, the chunks an engine still hits with it dead): the master of the
    first chunk not on chunk 0's master, so the chunks before it stay up (a partial outage);
    chunk 0's master if one master holds them all (then nothing is hit)."""
    masters = [cluster.master_of(n) for n in names]
    for i, m in enumerate(masters):
        if m != masters[0]:
            return m, i
    return masters[0], 0


def test_cross_process_cluster_restart_and_master_down(
        model: Path, redis_cluster: LocalRedisCluster, tmp_path: Path,
        record_property: Any) -> None:
    redis = {"cluster_nodes": redis_cluster.startup_nodes, "namespace": NAMESPACE,
             "timeout_s": 0.5}
    disk = {"path": str(tmp_path / "kv"), "capacity": "256MiB", "fsync": False}
    a = run_child(model, {"host": HOST, "disk": disk, "redis": redis,
                          "write_policy": "write-through"})
    cold = tuple(a["tokens"])
    assert a["num_cached"] == 0 and a["promoted"] == {}
    names = [f"{NAMESPACE}:rank0:{k}" for k in a["keys"]]
    assert len(names) == 4  # the keys the child computed are the ones A wrote
    assert all(redis_cluster.nodes[redis_cluster.master_of(n)].query("EXISTS", n) == 1
               for n in names)

    # another process, an empty host tier, the same cluster
    b = run_child(model, {"host": HOST, "redis": redis, "wait_timeout_s": WAIT})
    assert tuple(b["tokens"]) == cold
    assert b["num_cached"] == 512 and b["promoted"] == {"redis": 4}

    c = run_child(model, {"host": HOST, "disk": disk, "wait_timeout_s": WAIT})  # A's disk
    assert (tuple(c["tokens"]), c["num_cached"], c["promoted"]) == (cold, 512, {"disk": 4})

    # one master down: identical tokens, the chunks before its first one hit, no stall
    victim, survivors = partial_victim(redis_cluster, names)
    redis_cluster.kill(victim)
    record_property("chunks_hit_with_one_master_down", survivors)  # 0: all were on it
    d = run_child(model, {"host": HOST, "redis": redis, "wait_timeout_s": WAIT})
    assert tuple(d["tokens"]) == cold
    assert d["num_cached"] == survivors * CHUNK_TOKENS
    # chunks past the dead master's first one may be promoted too (a probe batch promotes
    # every chunk the live masters hold), though they cannot extend the hit
    assert d["promoted"].get("redis", 0) >= survivors
    assert 0 < d["ttft_s"] <= WAIT + ENGINE_MARGIN_S
    record_property("ttft_s_with_one_master_down", round(d["ttft_s"], 3))
