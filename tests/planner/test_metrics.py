"""Metrics fold request totals into planner totals and export as plain data."""

from __future__ import annotations

import pytest

from kvtier.planner import Metrics


def test_add_folds_counters_and_per_key_counts() -> None:
    total = Metrics(hit_tokens=5, hit_tokens_by_tier={"host": 5}, waits=1)
    total.lookups["hit"] = 2
    one = Metrics(hit_tokens=3, hit_tokens_by_tier={"host": 1, "disk": 2}, store_refusals=4)
    one.lookups["hit"] = 1
    total.add(one)
    out = total.as_dict()
    assert out["hit_tokens"] == 8 and out["waits"] == 1 and out["store_refusals"] == 4
    assert out["hit_tokens_by_tier"] == {"host": 6, "disk": 2}
    assert out["lookups"]["hit"] == 3  # type: ignore[index]
    assert one.as_dict()["hit_tokens_by_tier"] == {"host": 1, "disk": 2}  # unchanged


def test_as_dict_is_a_copy_with_every_counter() -> None:
    m = Metrics()
    out = m.as_dict()
    assert set(out) >= {"lookups", "hit_tokens", "bytes_stored", "load_failures"}
    out["hit_tokens_by_tier"]["host"] = 1  # type: ignore[index]
    assert m.hit_tokens_by_tier == {}


def test_fresh_counters_are_not_shared_and_unknown_names_are_refused() -> None:
    a, b = Metrics(), Metrics()
    a.lookups["hit"] += 1
    a.hit_tokens_by_tier["host"] = 1
    assert b.lookups["hit"] == 0 and b.hit_tokens_by_tier == {}  # each its own dicts
    assert Metrics(waits=2) == Metrics(waits=2) != Metrics(waits=3)
    with pytest.raises(TypeError, match=r"no counter 'hits'.*hit_tokens"):
        Metrics(hits=1)
