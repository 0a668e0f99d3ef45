"""The Planner drives a TieredStore unchanged: a prefix evicted to disk is reported WAIT
while it is promoted, then HIT, and the load job reads the promoted bytes from host slots."""

from __future__ import annotations

from pathlib import Path

from tier_helpers import SLOT, Clock, payload

from kvtier.keys import Namespace
from kvtier.layout import Group, Layout
from kvtier.planner import Outcome, Planner, TransferJob
from kvtier.tiers.config import DiskConfig, HostConfig, TierConfig
from kvtier.tiers.tiered import TieredStore

LAYOUT = Layout((Group("full", 16, bytes_per_token=SLOT // 16),))


def table(num_tokens: int, first_id: int) -> list[list[int | None]]:
    return [list(range(first_id, first_id + -(-num_tokens // 16)))]


def run_stores(store: TieredStore, job: TransferJob | None) -> None:
    """The data plane: each chunk's bytes are a function of its key."""
    assert job is not None
    for c in job.copies:
        store.backend.write(c.slot, payload(c.key.hex()))


def produce(planner: Planner, store: TieredStore, rid: str, tokens: list[int]) -> None:
    planner.add_request(rid, tokens)
    job = planner.on_computed(rid, len(tokens), table(len(tokens), 1000 * len(rid)))
    run_stores(store, job)
    assert job is not None
    planner.complete_store(job.id, True)
    planner.finish(rid)


def test_a_prefix_evicted_to_disk_is_waited_for_then_hit(tmp_path: Path) -> None:
    config = TierConfig(host=HostConfig(capacity=2 * SLOT, pin_memory=False),
                        disk=DiskConfig(path=str(tmp_path), capacity="1MiB"))
    clock = Clock()
    with TieredStore.from_config(config, LAYOUT, clock=clock) as store:
        planner = Planner(LAYOUT, store, Namespace("test"), clock=clock,  # type: ignore[arg-type]
                          wait_timeout_s=1.0)
        prompt = list(range(32))
        produce(planner, store, "p", prompt)  # two chunks fill the host
        produce(planner, store, "q", list(range(500, 532)))  # and push p's down to disk
        assert store.flush()
        planner.add_request("r", [*prompt, 7])
        assert planner.lookup("r").outcome is Outcome.WAIT  # promotion started
        assert store.flush()
        hit = planner.lookup("r")
        assert hit.outcome is Outcome.HIT and hit.hit_tokens == 32
        job = planner.accept_hit("r", table(33, 5000))
        for c in job.copies:
            assert store.backend.read(c.slot) == payload(c.key.hex())
        assert planner.complete_load(job.id, True) is not None
        stats = store.stats()
        assert stats["disk"]["promoted"] == 2 and stats["host"]["hits"] == 2
        store.check_invariants()
