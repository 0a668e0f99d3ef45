"""The v2 methods under SGLang's real hybrid controller: full-attention and sliding-window
layers, the sliding-window pool's pages stored and fetched by SGLang's trailing-pages rule,
and that rule compared with kvtier's coverage contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.hicache_storage", reason="needs SGLang 0.5.23")
import hicache_kit as hk
import torch
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.test.kits.unified_radix_cache import fixtures as kit

from kvtier import coverage
from kvtier.integrations.sglang.hits import PoolQuery, fold
from kvtier.layout import Group

pytestmark = pytest.mark.sglang

TOKENS = list(range(100, 132))  # 8 pages of 4 tokens
PAGE = 4


def swa_indices(cache: hk.Cache, leaf: Any) -> torch.Tensor:
    """The sliding-window host indices along ``leaf``'s path, in token order."""
    parts = [kit.node_host_value(cache.tree, n, ComponentType.SWA) for n in hk.path(cache, leaf)]
    return torch.cat([p for p in parts if p is not None])


def swa_pages(cache: hk.Cache, indices: torch.Tensor) -> list[bytes]:
    pool = cache.backend.pools["swa"].host
    return [hk.page_bytes_of(pool, s) for s in indices[::PAGE].tolist()]


def produce(extra: dict[str, Any], window: int) -> tuple[list[bytes], list[bytes]]:
    """Back up ``TOKENS`` from a full + sliding-window producer: its KV and SWA pages."""
    with hk.sglang_cache(extra, window=window) as prod:
        leaf = hk.insert(prod, TOKENS)
        kv = hk.fill_host(prod, hk.host_indices(prod, leaf), seed=1)
        prod.backend.pages()
        swa = hk.fill_pool(prod.backend.pools["swa"].host, swa_indices(prod, leaf), PAGE, 2)
        hk.back_up(prod, leaf)
    return kv, swa


def sglang_swa_pages(tmp_path: Path, window: int) -> tuple[int, list[bytes], list[bytes]]:
    """Sliding-window pages a consumer fetched after a full hit, and whether they are the
    producer's last ones."""
    extra = {"interface_v1": 1, "disk": {"path": str(tmp_path / "kv"), "capacity": "64MiB",
                                         "fsync": False}}
    kv, swa = produce(extra, window)
    with hk.sglang_cache(extra, window=window) as cons:
        assert hk.prefetch(cons, TOKENS, "r") == len(TOKENS)
        assert hk.prefetched_pages(cons, TOKENS) == kv
        leaf = kit.match_prefix(cons.tree, TOKENS).last_host_node
        got = swa_pages(cons, swa_indices(cons, leaf))
        fetched = cons.backend.stats()["disk"]["hits"] - len(kv)
    return fetched, got, swa


def kvtier_pages(window: int) -> int:
    """Pages kvtier's coverage contract says a hit at the end of ``TOKENS`` needs."""
    group = Group("sliding_window", tokens_per_block=PAGE, window=window)
    return len(coverage.required(group, len(TOKENS)))


@pytest.mark.parametrize(("window", "sglang", "kvtier"), [
    (8, 2, 2),  # agree
    (4, 1, 1),  # agree
    (5, 2, 1),  # window = 1 (mod page): SGLang asks for one page more than kvtier needs
])
def test_sliding_window_pages_round_trip_by_the_trailing_rule(
        tmp_path: Path, window: int, sglang: int, kvtier: int) -> None:
    fetched, got, stored = sglang_swa_pages(tmp_path, window)
    assert fetched == sglang and len(got) == sglang
    assert got == stored[-sglang:]  # byte-exact: the window's last pages
    assert kvtier_pages(window) == kvtier <= sglang  # SGLang never asks for fewer


def test_mamba_state_round_trips_as_kvtiers_state_group_requires(tmp_path: Path) -> None:
    """Full attention plus Mamba layers (the Mamba host pool takes page_first layouts): the
    state at the prefix's end is stored with the KV and fetched back, one state, as kvtier's
    ``state`` group requires one chunk at a boundary."""
    extra = {"interface_v1": 1, "disk": {"path": str(tmp_path / "kv"), "capacity": "64MiB",
                                         "fsync": False}}
    with hk.sglang_cache(extra, mamba=True, layout="page_first") as prod:
        leaf = hk.insert(prod, TOKENS)
        kv = hk.fill_host(prod, hk.host_indices(prod, leaf), seed=1)
        prod.backend.pages()
        state_at = kit.node_host_value(prod.tree, leaf, ComponentType.MAMBA)
        states = hk.fill_pool(prod.backend.pools["mamba"].host, state_at, 1, seed=2)
        hk.back_up(prod, leaf)
    with hk.sglang_cache(extra, mamba=True, layout="page_first") as cons:
        assert hk.prefetch(cons, TOKENS, "r") == len(TOKENS)
        assert hk.prefetched_pages(cons, TOKENS) == kv
        node = kit.match_prefix(cons.tree, TOKENS).last_host_node
        got = kit.node_host_value(cons.tree, node, ComponentType.MAMBA)
        pool = cons.backend.pools["mamba"].host
        assert [hk.page_bytes_of(pool, int(i)) for i in got] == states
        fetched = cons.backend.stats()["disk"]["hits"] - len(kv)
    state = Group("state", tokens_per_block=PAGE, bytes_per_state=64)
    assert fetched == len(coverage.required(state, len(TOKENS))) == 1


def test_mamba_state_rule_matches_kvtier_state_groups() -> None:
    """A Mamba pool's transfer carries one key (the state at the prefix's end): a prefix is
    restorable exactly where kvtier's state group requires its one chunk."""
    state = Group("state", tokens_per_block=PAGE, bytes_per_state=64)
    held = [True, False, True, True, False, True]
    restorable = fold([True] * 6, [PoolQuery("mamba", "trailing_pages", held, 1)]).restorable
    by_coverage = [p for p in range(1, 7)
                   if all(held[c] for c in coverage.required(state, p * PAGE))]
    assert restorable == by_coverage == [1, 3, 4, 6]


def test_all_pages_and_block_groups() -> None:
    kv = [True] * 6
    dsa = PoolQuery("indexer", "all_pages", [True, True, True, False, True, True])
    blocks = PoolQuery("c4", "block_groups", [True] * 5 + [False], group_pages=2)
    assert fold(kv, [dsa]).final == 3
    result = fold(kv, [blocks])
    assert result.final == 6 and result.pool_pages["c4"] == 4  # a verdict, never a gate
    assert fold([True, False], [dsa]).pool_pages == {"kv": 1, "indexer": 1}
