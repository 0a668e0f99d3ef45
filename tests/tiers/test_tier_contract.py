"""The lower-tier contract, run against every tier (disk, Redis): round trips, batches,
misses, removal, geometry isolation, persistence across instances, asynchronous twins."""

from __future__ import annotations

from tier_helpers import SLOT, TierFactory, items, key, payload

from kvtier.tiers.lower import LowerTier


def test_round_trip_of_a_batch(make_tier: TierFactory) -> None:
    tier = make_tier()
    assert tier.put(items("abc")) == [key(n) for n in "abc"]
    got = tier.get([key(n) for n in "abxc"])
    assert {k: bytes(v) for k, v in got.items()} == dict(items("abc"))
    snap = tier.stats.snapshot()
    assert (snap["hits"], snap["misses"], snap["stored"]) == (3, 1, 3)
    assert snap["bytes_read"] == 3 * SLOT and snap["reads"] == 1
    tier.check_invariants()


def test_short_payloads_come_back_exactly(make_tier: TierFactory) -> None:
    tier = make_tier()
    tier.put([(key("s"), payload("s", 100)), (key("e"), b"")])
    got = tier.get([key("s"), key("e")])
    assert bytes(got[key("s")]) == payload("s", 100) and bytes(got[key("e")]) == b""


def test_remove_then_miss(make_tier: TierFactory) -> None:
    tier = make_tier()
    tier.put(items("ab"))
    tier.remove([key("a"), key("zz")])
    assert list(tier.get([key("a"), key("b")])) == [key("b")]
    tier.check_invariants()


def test_another_geometry_never_hits(make_tier: TierFactory) -> None:
    make_tier(geometry=b"layout-A").put(items("a"))
    other = make_tier(geometry=b"layout-B")
    assert other.get([key("a")]) == {}
    assert other.stats.corrupt == 1  # a record for another layout is dropped, counted


def test_a_new_instance_serves_what_an_earlier_one_stored(make_tier: TierFactory) -> None:
    make_tier().put(items("ab"))
    later = make_tier()
    assert {k: bytes(v) for k, v in later.get([key("a"), key("b")]).items()} == dict(items("ab"))


def test_async_twins_return_futures(make_tier: TierFactory) -> None:
    tier: LowerTier = make_tier()
    assert tier.put_async(items("ab")).result(timeout=10) == [key("a"), key("b")]
    got = tier.get_async([key("a"), key("q")]).result(timeout=10)
    assert list(got) == [key("a")] and bytes(got[key("a")]) == payload("a")
    tier.remove_async([key("a")]).result(timeout=10)
    assert tier.get([key("a")]) == {}


def test_might_hold_is_true_for_what_was_stored(make_tier: TierFactory) -> None:
    tier = make_tier()
    tier.put(items("a"))
    assert tier.might_hold(key("a"))
