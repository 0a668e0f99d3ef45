"""``PageTiers``: pages over the lower tiers for an engine with its own host memory (SGLang).

Every call answers within its deadline: a tier that raises, stalls or holds a bad record
costs a miss, never an exception and never an unverified page.
"""

from __future__ import annotations

import doctest
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from tier_helpers import GEOMETRY, items, key, payload

from kvtier.keys import ChunkKey
from kvtier.tiers import pages as pages_module
from kvtier.tiers.config import TierConfig
from kvtier.tiers.disk.directory import record_path
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.lower import AsyncTwins, Demote, Item, TierStats, Workers
from kvtier.tiers.pages import PageTiers

SLOT = 256


def disk_config(path: Path, **top: object) -> TierConfig:
    return TierConfig.from_dict({"host": {"capacity": 1}, **top,
                                 "disk": {"path": str(path), "capacity": "1MiB",
                                          "fsync": False}})


class FakeTier(AsyncTwins):
    """A lower tier in memory whose calls a test can make raise or block."""

    def __init__(self, name: str = "fake") -> None:
        self.name, self.stats = name, TierStats(name)
        self.data: dict[ChunkKey, bytes] = {}
        self.fail = False
        self.release = threading.Event()
        self.release.set()
        self._workers = Workers(name, 2)

    def might_hold(self, key: ChunkKey) -> bool:
        return key in self.data

    def _gate(self) -> None:
        self.release.wait(timeout=30)
        if self.fail:
            raise ConnectionError("the tier went away")

    def get(self, keys: Sequence[ChunkKey]) -> dict[ChunkKey, memoryview]:
        self._gate()
        return {k: memoryview(self.data[k]) for k in keys if k in self.data}

    def put(self, items: Sequence[Item]) -> list[ChunkKey]:
        self._gate()
        self.data.update((k, bytes(p)) for k, p in items)
        return [k for k, _ in items]

    def remove(self, keys: Sequence[ChunkKey]) -> None:
        for k in keys:
            self.data.pop(k, None)

    def set_demote(self, demote: Demote | None) -> None:
        pass

    def check_invariants(self) -> None:
        pass

    def close(self) -> None:
        self.release.set()
        self._workers.close()


def fake_pages(tmp_path: Path, tier: FakeTier, **top: object) -> PageTiers:
    return PageTiers(disk_config(tmp_path, **top), SLOT, GEOMETRY, deadline_s=0.2,
                     tiers=[tier])


def test_round_trip_through_a_disk_tier_and_after_reopening(tmp_path: Path) -> None:
    pages = PageTiers(disk_config(tmp_path), SLOT, GEOMETRY)
    assert pages.put(items("abc", SLOT)) == [True, True, True]
    assert pages.exists([key("a"), key("b"), key("x"), key("c")]) == 2
    assert pages.held([key("x"), key("c")]) == [False, True]
    pages.close()
    again = PageTiers(disk_config(tmp_path), SLOT, GEOMETRY)
    got = again.get([key("a"), key("x")])
    assert list(got) == [key("a")] and bytes(got[key("a")]) == payload("a", SLOT)
    again.close()


def test_another_geometry_never_reads_the_pages(tmp_path: Path) -> None:
    first = PageTiers(disk_config(tmp_path), SLOT, GEOMETRY)
    first.put(items("a", SLOT))
    first.close()
    other = PageTiers(disk_config(tmp_path), SLOT, b"othergeo")
    assert other.get([key("a")]) == {}
    assert other.stats()["disk"]["corrupt"] == 1
    other.close()


def test_a_corrupt_record_is_a_miss(tmp_path: Path) -> None:
    pages = PageTiers(disk_config(tmp_path), SLOT, GEOMETRY)
    pages.put(items("ab", SLOT))
    path = record_path(tmp_path, key("b"))
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    got = pages.get([key("a"), key("b")])
    assert list(got) == [key("a")]
    assert pages.stats()["disk"]["corrupt"] == 1
    pages.close()


def test_a_failing_tier_costs_misses_not_exceptions(tmp_path: Path) -> None:
    tier = FakeTier()
    pages = fake_pages(tmp_path, tier)
    assert pages.put(items("a", SLOT)) == [True]
    tier.fail = True
    assert pages.get([key("a")]) == {}
    assert pages.put(items("b", SLOT)) == [False]
    pages.close()


def test_a_stalled_tier_costs_misses_at_the_deadline(tmp_path: Path) -> None:
    tier = FakeTier()
    pages = fake_pages(tmp_path, tier)
    pages.put(items("a", SLOT))
    tier.release.clear()  # every call now blocks until released
    assert pages.get([key("a")]) == {}
    assert pages.put(items("b", SLOT)) == [False]
    assert pages.stats()["pages"]["late"] == 2
    tier.release.set()
    assert bytes(pages.get([key("a")])[key("a")]) == payload("a", SLOT)  # control
    pages.close()


def test_admission_declines_a_first_offer_cleanly(tmp_path: Path) -> None:
    tier = FakeTier()
    pages = fake_pages(tmp_path, tier, admit_after=2)
    assert pages.put(items("a", SLOT)) == [True]  # declined: reported done, not written
    assert pages.exists([key("a")]) == 0 and pages.stats()["pages"]["declined"] == 1
    assert pages.put(items("a", SLOT)) == [True]
    assert pages.exists([key("a")]) == 1
    pages.close()


def test_write_back_hands_disk_evictions_down_and_reads_promote(tmp_path: Path) -> None:
    below = FakeTier("below")
    disk_cfg = disk_config(tmp_path)
    disk = DiskTier(tmp_path / "d", 2 * (SLOT + 72), SLOT, geometry=GEOMETRY, fsync=False)
    pages = PageTiers(disk_cfg, SLOT, GEOMETRY, tiers=[disk, below])
    assert pages.put(items("abc", SLOT)) == [True, True, True]  # a evicted to "below"
    disk.close()  # finishes the hand-down
    assert key("a") in below.data and pages.held([key("a"), key("c")]) == [True, True]
    pages.close()


def test_a_config_without_lower_tiers_is_refused() -> None:
    with pytest.raises(ValueError, match="no tier"):
        PageTiers(TierConfig.from_dict({"host": {"capacity": 1}}), SLOT)


def test_doctests() -> None:
    result = doctest.testmod(pages_module)
    assert result.attempted > 0 and result.failed == 0
