"""The hierarchy's rules over tiers that keep only keys (``MetadataTier``, ``NoBytes``):
the metadata replay's store. Promotion completes within lookup; placement, write-back,
demotion and the protection of a lookup's own chunks are the real store's."""

from __future__ import annotations

import doctest

import pytest
from tier_helpers import key

from kvtier.keys import ChunkKey
from kvtier.store import ChunkState, ChunkStore, StoreHandle
from kvtier.tiers import lower, metadata
from kvtier.tiers.metadata import MetadataTier, NoBytes
from kvtier.tiers.tiered import Placement, TieredStore

A, R = ChunkState.ABSENT, ChunkState.READY


def metadata_stack(
    host_slots: int = 2, disk_slots: int = 4, placement: Placement = "inclusive",
    below: MetadataTier | None = None,
) -> tuple[TieredStore, MetadataTier]:
    disk = MetadataTier("disk", disk_slots)
    lower = [disk] if below is None else [disk, below]
    host = ChunkStore(backend=NoBytes(host_slots))
    return TieredStore(host, lower, placement=placement, miss_ttl_s=0.0), disk


def store(tiers: TieredStore, names: str) -> None:
    for n in names:
        handle = tiers.prepare_store([key(n)])
        assert isinstance(handle, StoreHandle)
        tiers.complete_store(handle, ok=True)


def held(tier: MetadataTier, names: str) -> list[bool]:
    return tier.exists([key(n) for n in names])


def test_the_tier_keeps_keys_by_lru_and_a_read_is_a_use() -> None:
    tier = MetadataTier("disk", 2)
    evicted: list[ChunkKey] = []
    tier.set_demote(lambda k, p: evicted.append(k))
    assert tier.put([(key("a"), b""), (key("b"), b"")]) == [key("a"), key("b")]
    assert list(tier.get([key("a"), key("x")])) == [key("a")]  # a is now the most recent
    tier.put([(key("c"), b"")])
    assert held(tier, "abc") == [True, False, True] and evicted == [key("b")]
    snap = tier.stats.snapshot()
    assert (snap["hits"], snap["misses"], snap["stored"], snap["evicted"]) == (1, 1, 3, 1)
    tier.check_invariants()


@pytest.mark.parametrize("placement", ["inclusive", "exclusive"])
def test_a_chunk_below_is_promoted_within_the_lookup(placement: Placement) -> None:
    tiers, disk = metadata_stack(placement=placement)
    seen: list[tuple[ChunkKey, str]] = []
    tiers.watch_promotions(lambda k, name: seen.append((k, name)))
    store(tiers, "abc")  # c evicts a, written back to disk
    assert held(disk, "a") == [True]
    assert tiers.lookup([key("a")]) == [R]  # READY at once: no WAIT round
    assert seen == [(key("a"), "disk")] and tiers.stats()["disk"]["promoted"] == 1
    assert held(disk, "ab") == [placement == "inclusive", True]  # b was evicted by a
    tiers.check_invariants()


def test_exclusive_placement_makes_room_below_before_writing_back() -> None:
    tiers, disk = metadata_stack(host_slots=1, disk_slots=1, placement="exclusive")
    store(tiers, "ab")  # a goes down; the disk is full
    assert tiers.lookup([key("a")]) == [R]  # a comes up, b goes down into a's place
    assert held(disk, "ab") == [False, True] and disk.stats.evicted == 0


def test_a_promotion_never_evicts_the_lookups_own_chunks() -> None:
    tiers, disk = metadata_stack()
    store(tiers, "abc")  # host: b, c; disk: a
    assert tiers.lookup([key("b"), key("c"), key("a")]) == [R, R, A]  # no room for a
    assert held(disk, "a") == [True] and tiers.lookup([key("a")]) == [R]


def test_write_back_cascades_to_the_next_metadata_tier() -> None:
    far = MetadataTier("redis", 8)
    tiers, disk = metadata_stack(host_slots=1, disk_slots=1, below=far)
    store(tiers, "abc")  # a to disk, then b to disk pushes a to the far tier
    assert held(disk, "ab") == [False, True] and held(far, "a") == [True]
    assert tiers.lookup([key("a")]) == [R] and tiers.stats()["redis"]["promoted"] == 1


def test_bad_arguments_are_refused_with_a_message() -> None:
    with pytest.raises(ValueError, match="zero-byte slot"):
        NoBytes(2).write(0, b"x")
    with pytest.raises(ValueError, match="num_slots must be an integer >= 1"):
        NoBytes(0)
    host = ChunkStore(backend=NoBytes(2))
    with pytest.raises(ValueError, match="needs write_policy='write-back'"):
        TieredStore(host, [MetadataTier("disk", 2)], write_policy="write-through",
                    placement="exclusive")
    with pytest.raises(ValueError, match="placement must be one of"):
        TieredStore(host, placement="nowhere")  # type: ignore[arg-type]


@pytest.mark.parametrize("module", [metadata, lower])
def test_doctests(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.failed == 0 and result.attempted > 0
