"""kvtier's backend under SGLang's real HiCacheController, radix cache and host pool threads.

A producer cache backs its pages up to storage on the controller's backup thread; a second
cache (a new backend over the same tiers, as after a restart) prefetches them on its
prefetch threads. Pages are compared byte for byte with what the producer's host pool held.
"""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.hicache_storage", reason="needs SGLang 0.5.23")
import hicache_kit as hk
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageFailureInjector

from kvtier.integrations.sglang import KvtierHiCacheStorage
from kvtier.tiers.disk.directory import record_path
from tiers.tier_helpers import REDIS_SERVER, RedisServer, free_port

pytestmark = pytest.mark.sglang

TOKENS = list(range(100, 132))  # 8 pages of 4 tokens


def disk(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"disk": {"path": str(tmp_path / "kv"), "capacity": "64MiB", "fsync": False},
            **more}


def produce(extra: dict[str, Any], tokens: list[int] = TOKENS, seed: int = 1,
            **cache: Any) -> tuple[list[bytes], list[str]]:
    """Back ``tokens`` up to storage from a producer cache; its pages and page hashes."""
    with hk.sglang_cache(extra, **cache) as prod:
        leaf = hk.insert(prod, tokens)
        pages = hk.fill_host(prod, hk.host_indices(prod, leaf), seed)
        hk.back_up(prod, leaf)
        hashes = [h for n in hk.path(prod, leaf) for h in prod.tree.tree_core.get_hash_values(n)]
        assert prod.backend.stats()["sglang"]["errors"] == 0
    return pages, hashes


@pytest.mark.parametrize("v1", [1, 0], ids=["interface_v1", "legacy"])
@pytest.mark.parametrize("layout", hk.LAYOUTS)
def test_pages_round_trip_byte_exact(tmp_path: Path, layout: str, v1: int) -> None:
    extra = disk(tmp_path, interface_v1=v1)
    pages, _ = produce(extra, layout=layout)
    with hk.sglang_cache(extra, layout=layout) as cons:
        assert isinstance(cons.backend, KvtierHiCacheStorage)
        assert hk.prefetch(cons, TOKENS, "r") == len(TOKENS)
        assert hk.prefetched_pages(cons, TOKENS) == pages
        assert cons.backend.stats()["disk"]["hits"] == len(pages)


@pytest.mark.parametrize(("consumer", "hit"), [
    ({}, len(TOKENS)),                                      # control: the same deployment
    ({"layout": "page_first"}, 0),                          # pages ordered otherwise
    ({"tenant_salt": "other"}, 0),
    ({"model_revision": "v2"}, 0),
])
def test_another_deployment_never_reads_the_pages(tmp_path: Path, consumer: dict[str, Any],
                                                  hit: int) -> None:
    produce(disk(tmp_path))
    layout = consumer.pop("layout", "layer_first")
    with hk.sglang_cache(disk(tmp_path, **consumer), layout=layout) as cons:
        assert hk.prefetch(cons, TOKENS, "r") == hit


def test_a_corrupt_record_ends_the_hit_before_it(tmp_path: Path) -> None:
    pages, hashes = produce(disk(tmp_path))
    with hk.sglang_cache(disk(tmp_path)) as cons:
        backend = cons.backend
        backend.pages()
        shard = tmp_path / "kv" / backend.namespace.shard()
        path = record_path(shard, backend.pools["kv"].key(hashes[3]))
        raw = bytearray(path.read_bytes())
        raw[100] ^= 0x01
        path.write_bytes(bytes(raw))
        assert hk.prefetch(cons, TOKENS, "r") == 3 * 4
        assert hk.prefetched_pages(cons, TOKENS[:12]) == pages[:3]
        assert backend.stats()["disk"]["corrupt"] == 1


def test_sglang_delay_and_failure_injection(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's own injector in front of kvtier: calls fail or stall at random; whatever a
    prefetch brings is exactly what was stored, and nothing raises."""
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY", "0.01")
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.2")
    extra = disk(tmp_path, interface_v1=1)
    runs = [list(range(1000 * i, 1000 * i + 32)) for i in range(1, 7)]
    produced = [produce(extra, tokens, seed=i)[0] for i, tokens in enumerate(runs)]
    with hk.sglang_cache(extra) as cons:
        assert isinstance(cons.controller.storage_backend, HiCacheStorageFailureInjector)
        for i, (tokens, pages) in enumerate(zip(runs, produced, strict=True)):
            hit = hk.prefetch(cons, tokens, f"r{i}")
            assert hk.prefetched_pages(cons, tokens[:hit]) == pages[: hit // 4]
        assert cons.backend.stats()["sglang"]["errors"] == 0


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not on PATH")
def test_a_stalled_redis_costs_a_miss_within_the_deadline(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        extra = {"redis": {"url": server.url, "timeout_s": 5.0}, "deadline_s": 0.3}
        pages, _ = produce(extra)
        with hk.sglang_cache(extra) as cons:
            assert server.proc is not None
            server.proc.send_signal(signal.SIGSTOP)  # accepts connections, never answers
            try:
                assert hk.prefetch(cons, TOKENS, "stalled") == 0
                assert cons.backend.stats()["pages"]["late"] >= 1
            finally:
                server.proc.send_signal(signal.SIGCONT)
            assert hk.prefetch(cons, TOKENS, "resumed") == len(TOKENS)  # control
            assert hk.prefetched_pages(cons, TOKENS) == pages
    finally:
        server.stop()


def test_kvtier_metrics_are_served_per_rank(tmp_path: Path) -> None:
    port = free_port()
    with hk.sglang_cache(disk(tmp_path, metrics_port=port)) as prod:
        leaf = hk.insert(prod, TOKENS)
        hk.fill_host(prod, hk.host_indices(prod, leaf), seed=3)
        hk.back_up(prod, leaf)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    assert 'kvtier_chunks_stored_total{tier="disk"} 8.0' in text
    assert 'kvtier_store_seconds_count{tier="disk"} 1.0' in text
