"""The replay with admission (``--admit``), write amplification and normalized hit rates:
admission 1 is the replay without it, exactly; admission 2 equals a plain simulation."""

from __future__ import annotations

import dataclasses
import json

import pytest
from oracles import simple_lru_admit
from test_cli_replay import run

from kvtier.layout import Group, Layout
from kvtier.replay import ReplayConfig, Workload, read_trace, replay
from kvtier.replay.stats import ReplayStats
from kvtier.store.admission import Admission

FULL_512 = Layout((Group("full", 512, bytes_per_token=1024),))
PER_CHUNK = 512 * 1024


PLAIN = Admission()


def workload(limit: int | None, admission: Admission = PLAIN) -> Workload:
    return Workload(read_trace(limit=limit), ReplayConfig(FULL_512, admission=admission))


def figures(stats: ReplayStats) -> dict[str, object]:
    return {k: v for k, v in stats.as_dict().items() if k != "wall_s"}


def test_admit_1_is_the_replay_without_admission() -> None:
    plain = replay(workload(600), "lru", 400, disk_slots=300)
    admit1 = replay(workload(600, Admission(1, window=7)), "lru", 400, disk_slots=300)
    assert figures(admit1) == figures(plain)
    assert plain.chunks_not_admitted == 0 and plain.block_hits > 0


@pytest.mark.parametrize(("capacity", "after", "window"), [(300, 2, 1200), (500, 3, 5000)])
def test_admission_equals_a_plain_simulation(capacity: int, after: int, window: int) -> None:
    w = workload(1500, Admission(after, window))
    stats = replay(w, "lru", capacity)
    hits, writes = simple_lru_admit(w.requests, capacity, after, window)
    assert (stats.block_hits, stats.chunks_written_by_tier["host"]) == (hits, writes)
    plain = replay(workload(1500), "lru", capacity)
    assert stats.chunks_written_by_tier["host"] < plain.chunks_written_by_tier["host"] / 2
    assert stats.chunks_not_admitted > 0


@pytest.mark.slow
@pytest.mark.parametrize("capacity", [3000, 10000])
def test_second_sighting_on_the_whole_trace(capacity: int) -> None:
    """The anchor: LRU 6.5% of blocks at 3,000 chunks; admission at the second offer
    within 4 offers per slot, 13.3%."""
    w = workload(None, Admission(2))
    stats = replay(w, "lru", capacity)
    hits, writes = simple_lru_admit(w.requests, capacity, 2, 4 * capacity)
    assert (stats.block_hits, stats.chunks_written_by_tier["host"]) == (hits, writes)
    if capacity == 3000:
        assert round(stats.block_hit_rate, 3) == 0.133


def test_write_amplification_counts_every_tier() -> None:
    stats = replay(workload(600), "lru", 300, disk_slots=2000)
    written = stats.bytes_written_by_tier
    promoted = stats.chunks_loaded_by_tier.get("disk", 0)
    assert written["host"] >= (stats.groups[0].stored + promoted) * PER_CHUNK
    assert 0 < written["disk"] == stats.chunks_written_by_tier["disk"] * PER_CHUNK
    per = stats.as_dict()["bytes_written_per_hit_token"]
    assert per == {t: n / stats.hit_tokens for t, n in written.items()}
    empty = dataclasses.replace(stats, hit_tokens=0)
    assert set(empty.written_per_hit_token().values()) == {None}


def test_cli_normalized_admit_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    small = ["--limit", "400", "--model", "llama-3.1-8b", "--host-chunks", "300"]
    code, out, err = run(capsys, *small, "--policy", "all", "--admit", "1", "--json")
    policies = json.loads(out)["policies"]
    assert code == 0 and err == ""
    assert policies["lru"]["normalized_token_hit_rate"] == 0.0
    assert policies["belady"]["normalized_block_hit_rate"] == 1.0
    assert policies["infinite"]["normalized_block_hit_rate"] > 1.0
    code, out, _ = run(capsys, *small, "--json")  # the default: admission at the 2nd offer
    obj = json.loads(out)
    lru = obj["policies"]["lru"]
    assert code == 0 and obj["admit_after"] == 2 and lru["chunks_not_admitted"] > 0
    assert set(lru["bytes_written_per_hit_token"]) == {"host"}
    assert "normalized_token_hit_rate" not in lru  # no Belady to normalize by
    code, out, _ = run(capsys, *small, "--policy", "lru,belady", "--admit", "1")
    assert code == 0 and "written per hit token" in out and "admit after 1" in out
    assert "normalized" in out and "1.000" in out
