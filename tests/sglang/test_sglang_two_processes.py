"""Pages stored by one SGLang process, read by another: through a real Redis Cluster, and
through the disk tier after the writer exited (a restart).

The producer is a separate OS process (``sglang_producer.py``) writing through to a disk
directory and a three-master Redis Cluster (``tests/redis_cluster.py``); each consumer here
opens one of the two tiers only, so its hits can come from nowhere else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.hicache_storage", reason="needs SGLang 0.5.23")
import hicache_kit as hk
from sglang_producer import TOKENS

from redis_cluster import HAVE_CLUSTER_TOOLS, LocalRedisCluster

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(not HAVE_CLUSTER_TOOLS, reason="redis-server/redis-cli "
                                 "not on PATH (CI installs Debian's redis-server)")]
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The cluster and the disk directory after a producer process backed ``TOKENS`` up."""
    work = tmp_path_factory.mktemp("two-processes")
    with LocalRedisCluster(work / "cluster") as cluster:
        tiers = {"disk": {"path": str(work / "kv"), "capacity": "64MiB", "fsync": False},
                 "redis": {"cluster_nodes": cluster.startup_nodes, "timeout_s": 5.0},
                 "write_policy": "write-through"}
        out = work / "produced.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, str(HERE / "sglang_producer.py"),
                        json.dumps({"interface_v1": 1, **tiers}), str(out)],
                       check=True, env=env, timeout=300)
        result = json.loads(out.read_text())
        yield {"tiers": tiers, "pages": [bytes.fromhex(p) for p in result["pages"]],
               "stats": result["stats"]}


def test_the_producer_wrote_every_page_to_both_tiers(produced: dict[str, Any]) -> None:
    stats = produced["stats"]
    assert stats["disk"]["stored"] == stats["redis"]["stored"] == len(produced["pages"]) == 8


@pytest.mark.parametrize("tier", ["disk", "redis"])
def test_another_process_reads_them_byte_exact(produced: dict[str, Any], tier: str) -> None:
    with hk.sglang_cache({"interface_v1": 1, tier: produced["tiers"][tier]}) as cons:
        assert hk.prefetch(cons, TOKENS, "r") == len(TOKENS)
        assert hk.prefetched_pages(cons, TOKENS) == produced["pages"]
        stats = cons.backend.stats()
        assert stats[tier]["hits"] == 8 and stats[tier]["corrupt"] == 0
