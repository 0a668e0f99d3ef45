"""The backend as SGLang loads it (its real StorageBackendFactory), its options, its keys."""

from __future__ import annotations

import dataclasses
import doctest
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.hicache_storage", reason="needs SGLang 0.5.23")
import hicache_kit as hk
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageConfig,
    HiCacheStorageFailureInjector,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from kvtier.integrations.sglang import KvtierHiCacheStorage, SglangOptions, hits, keys, options
from kvtier.integrations.sglang.keys import PageNamespace, PagePool, namespace_of
from kvtier.keys import KeyChain, Namespace
from kvtier.layout import Group, Layout

pytestmark = pytest.mark.sglang


def storage_config(extra: dict[str, Any], **fields: Any) -> HiCacheStorageConfig:
    base = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                model_name="org/tiny", extra_config=extra)
    return HiCacheStorageConfig(**{**base, **fields})


def disk(tmp_path: Path) -> dict[str, Any]:
    return {"path": str(tmp_path / "kv"), "capacity": "16MiB", "fsync": False}


def test_the_factory_loads_it_by_module_path(tmp_path: Path) -> None:
    extra = {**hk.BACKEND, "disk": disk(tmp_path)}
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
    assert type(backend) is KvtierHiCacheStorage
    assert backend.options.tiers.disk is not None
    backend.close()


def test_the_factory_wraps_it_in_sglangs_injector(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "1.0")
    extra = {**hk.BACKEND, "disk": disk(tmp_path)}
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
    assert isinstance(backend, HiCacheStorageFailureInjector)
    assert backend.batch_exists(["ab" * 32]) == 0  # every call fails, as SGLang decides
    backend.close()


def test_a_bad_extra_config_fails_at_start_up_saying_what_is_wrong(tmp_path: Path) -> None:
    extra = {**hk.BACKEND, "disk": {**disk(tmp_path), "capacty": 1}}
    with pytest.raises(ValueError, match=r"\[disk\]: unknown key 'capacty'"):
        StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)


@pytest.mark.parametrize(("extra", "message"), [
    ({}, "give a disk or a redis section"),
    ({"host": {"capacity": 1}}, "SGLang's host pool is host memory"),
    ({"redis": {}, "deadline_s": 0}, "deadline_s"),
    ({"redis": {}, "metrics_port": 70000}, "metrics_port"),
    ({"redis": {}, "chunk_tokens": 16}, r"unknown option\(s\) \['chunk_tokens'\]"),
    ("not a table", "must be a table"),
])
def test_options_refuse_bad_input(extra: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SglangOptions.from_extra_config(extra)


def test_options_take_the_vllm_connectors_tier_keys(tmp_path: Path) -> None:
    opts = SglangOptions.from_extra_config({
        **hk.BACKEND, "interface_v1": 1, "write_policy": "write-through", "admit_after": 2,
        "disk": disk(tmp_path), "redis": {"cluster_nodes": ["127.0.0.1:7000"]}})
    assert opts.tiers.write_policy == "write-through" and opts.tiers.admit_after == 2
    assert opts.tiers.redis is not None
    assert opts.tiers.redis.cluster_nodes == ("redis://127.0.0.1:7000",)


BASE = PageNamespace(model="org/tiny", tp=(0, 2), pp=(0, 1), cp=(0, 1), layout="layer_first",
                     page_size=16, kv_dtype="torch.bfloat16")
POOL = PagePool("kv", 8192, "torch.bfloat16", "layer_first")


@pytest.mark.parametrize("change", [
    {"model": "org/other"}, {"tp": (1, 2)}, {"tp": (0, 4)}, {"pp": (1, 2)}, {"cp": (1, 2)},
    {"layout": "page_first"}, {"page_size": 32}, {"kv_dtype": "torch.float8_e4m3fn"},
    {"revision": "r2"}, {"salt": "tenant-b"},
])
def test_every_field_of_the_deployment_separates_keys_and_records(change: dict[str, Any]) -> None:
    other = dataclasses.replace(BASE, **change)
    assert other.tag(POOL) != BASE.tag(POOL)
    assert other.geometry() != BASE.geometry()


def test_pools_separate_keys_and_rank_replicated_kv_is_shared() -> None:
    mamba = PagePool("mamba", 8192, "torch.bfloat16", "layer_first")
    assert BASE.tag(mamba) != BASE.tag(POOL)
    assert BASE.tag(dataclasses.replace(POOL, page_bytes=4096)) != BASE.tag(POOL)
    mla = dataclasses.replace(BASE, replicated=True)
    rank1 = dataclasses.replace(mla, tp=(1, 2))
    assert rank1.tag(POOL) == mla.tag(POOL)          # one writer serves every TP rank
    assert rank1.tag(mamba) != mla.tag(mamba)        # Mamba state stays TP-sharded


def test_an_sglang_page_never_meets_a_vllm_chunk() -> None:
    """The same model, tokens and page size through kvtier's own keys: other keys."""
    tokens = list(range(16))
    layout = Layout((Group("full", 16, bytes_per_token=512),), model="org/tiny",
                    kv_dtype="bfloat16")
    chain = KeyChain(layout, Namespace("org/tiny", parallel="tp2"), tokens)
    vllm_key = chain.key(0, 0)
    page_hash = vllm_key[8:].hex()  # even a page hash equal to the chunk's own digest
    assert BASE.key(BASE.tag(POOL), page_hash) != vllm_key
    assert BASE.key(BASE.tag(POOL), page_hash)[:8] != vllm_key[:8]


def test_the_namespace_comes_from_sglangs_storage_config() -> None:
    cfg = storage_config({}, tp_rank=1, tp_size=2, is_mla_model=True, model_name="org/m")
    ns = namespace_of(cfg, "page_first", 64, "torch.float16")
    assert ns.tp == (1, 2) and ns.replicated and ns.shard() == "tp1of2-pp0of1-cp0of1"
    assert ns.layout == "page_first" and ns.page_size == 64 and ns.model == "org/m"


@pytest.mark.parametrize("module", [hits, keys, options])
def test_doctests(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.attempted > 0 and result.failed == 0
