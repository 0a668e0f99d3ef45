"""Tensor parallelism over the lower tiers, in plain data: the connector's scheduler half and
two workers (ranks), each with its own KV tensors, host slab and disk directory.

Each rank stores and finds its own shard; a hit needs every rank's. Runs without vLLM (the
halves take plain data), beside the other connector tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvtier.integrations.vllm.scheduler import ConnectorScheduler, StepRequest
from kvtier.integrations.vllm.tiers import scheduler_tiers
from kvtier.integrations.vllm.worker import ConnectorWorker
from kvtier.integrations.vllm.worker_tiers import RankTiers
from kvtier.layout import Group, Layout
from kvtier.tiers.config import TierConfig
from kvtier.tiers.records.format import geometry_of

pytestmark = pytest.mark.vllm

LAYOUT = Layout((Group("full", 4, 2, bytes_per_token=16),))  # 8-token chunks of 128 bytes
PROMPT = list(range(100, 125))  # 25 tokens: chunks 0-2 (boundaries 8, 16, 24)


class Ranks:
    """The scheduler half and ``n`` workers, stepping as vLLM would (one plan, every worker)."""

    def __init__(self, tmp_path: Path, n: int = 2) -> None:
        cfg = TierConfig.from_dict({"host": {"capacity": 16 * 128}, "write_policy":
                                    "write-through", "disk": {"path": str(tmp_path / "kv"),
                                                              "capacity": 64 * 128,
                                                              "fsync": False}})
        geometry = geometry_of(LAYOUT)
        self.sched = ConnectorScheduler(LAYOUT, 16, n, tiers=scheduler_tiers(cfg, n, 128,
                                                                               geometry))
        self.kv = [torch.zeros(16, 2, 4, 1, 2) for _ in range(n)]
        self.workers = [ConnectorWorker(LAYOUT, 16, pin_memory=False,
                                        tiers=RankTiers(cfg, r, 128, geometry))
                        for r in range(n)]
        for w, kv in zip(self.workers, self.kv, strict=True):
            w.register([[kv]], num_blocks=16)

    def run(self, steps: list[StepRequest]) -> None:
        plan = self.sched.step(steps)
        done: dict[int, tuple[int, bool]] = {}
        for w in self.workers:
            w.before_forward(plan)
            w.after_forward(plan)
            w.wait_all()
            w.tiers.drain()  # type: ignore[union-attr]
            for job_id, ok in w.collect().completed.items():
                count, all_ok = done.get(job_id, (0, True))
                done[job_id] = (count + 1, all_ok and ok)
        self.sched.on_reports(done)

    def lookup(self, request_id: str) -> int | None:
        self.sched.add_request(request_id, PROMPT)
        return self.sched.lookup(request_id, 0)[0]

    def close(self) -> None:
        self.sched.close()
        for w in self.workers:
            w.close()


def test_each_rank_its_shard_and_a_hit_needs_all(tmp_path: Path) -> None:
    ranks = Ranks(tmp_path)
    for r, kv in enumerate(ranks.kv):
        kv[1:7] = torch.arange(6 * 16, dtype=torch.float32).view(6, 2, 4, 1, 2) + 1000 * r
    expected = [kv[1:7].clone() for kv in ranks.kv]
    assert ranks.lookup("producer") == 0
    ranks.run([StepRequest("producer", ([1, 2, 3, 4, 5, 6, 7],), True, 25, PROMPT)])
    ranks.sched.finish("producer")
    shards = sorted((tmp_path / "kv").glob("rank*/chunks/*"))
    assert {p.parent.parent.name for p in shards} == {"rank0", "rank1"} and len(shards) == 6
    assert ranks.sched.clear_cache() == 3  # host memory empty: the hit must come from disk

    assert ranks.lookup("consumer") is None  # promoting from every rank's disk
    ranks.run([])
    assert ranks.sched.lookup("consumer", 0) == (24, True)  # promoted: a host hit
    for kv in ranks.kv:
        kv.zero_()
    ranks.sched.after_alloc("consumer", ([8, 9, 10, 11, 12, 13],), 24)
    ranks.run([])
    for kv, want in zip(ranks.kv, expected, strict=True):  # each rank got its own shard back
        assert torch.equal(kv[8:14], want[:6])
    assert not torch.equal(ranks.kv[0][8:14], expected[1][:6])  # negative control
    ranks.sched.finish("consumer")

    # one rank's record gone: no promotion, a miss, never half a chunk
    ranks.sched.clear_cache()
    for path in (tmp_path / "kv" / "rank1" / "chunks").iterdir():
        path.unlink()
    ranks.sched.add_request("again", PROMPT)
    assert ranks.sched.lookup("again", 0) == (0, False)
    ranks.close()

