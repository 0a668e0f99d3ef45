"""SGLang's real radix cache, host pool and HiCacheController around kvtier's backend.

Built with the test kit the sglang wheel ships (``sglang.test.kits.unified_radix_cache``),
with the three adjustments a CPU-only machine needs (docs/sglang.md, "What was tested"):
the kit's device is ``"cpu"``, the host pool does not pin memory, and the parallel state is
one rank. The controller's device-to-host copy runs CUDA kernels, so a test fills the host
pages itself (``fill_host``), as the kit's ``_simulate_backup`` does for the tree; the
backup to storage and the prefetch back run on the controller's own threads.
"""

from __future__ import annotations

import contextlib
import json
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, InsertParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.runtime_context import get_parallel
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.test.kits.unified_radix_cache import fixtures as kit
from sglang.test.kits.unified_radix_cache.config import CacheConfig
from sglang.test.kits.unified_radix_cache.mixins import UnifiedRadixCacheFixtures

BACKEND = {"backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
           "class_name": "KvtierHiCacheStorage"}
LAYOUTS = ("layer_first", "page_first", "page_first_direct")


@dataclass
class Cache:
    """One SGLang cache with kvtier attached: the tree, its allocator and the controller."""

    tree: Any
    allocator: Any
    req_to_token_pool: Any
    cfg: CacheConfig

    @property
    def controller(self) -> Any:
        return self.tree.cache_controller

    @property
    def backend(self) -> Any:
        """kvtier's backend (unwrapped from SGLang's fault injector, if that is on)."""
        b = self.controller.storage_backend
        return getattr(b, "_backend", b)

    @property
    def host(self) -> Any:
        return self.controller.storage_host_pool


def _unpinned(stack: contextlib.ExitStack) -> None:
    import sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler as assembler

    original = assembler.get_mha_host_pool_cls

    def wrapper(device_pool: Any) -> Callable[..., Any]:
        cls = original(device_pool)

        def build(*args: Any, **kwargs: Any) -> Any:
            kwargs["pin_memory"] = False
            return cls(*args, **kwargs)

        return build

    stack.enter_context(mock.patch.object(assembler, "get_mha_host_pool_cls", wrapper))
    mamba = assembler.MambaPoolHost

    def mamba_unpinned(*args: Any, **kwargs: Any) -> Any:
        return mamba(*args, **{**kwargs, "pin_memory": False})

    stack.enter_context(mock.patch.object(assembler, "MambaPoolHost", mamba_unpinned))


@contextlib.contextmanager
def sglang_cache(extra: dict[str, Any], *, layout: str = "layer_first", page_size: int = 4,
                 tp: tuple[int, int] = (0, 1), window: int | None = None,
                 mamba: bool = False) -> Iterator[Cache]:
    """A cache whose storage backend is kvtier with ``extra`` (tiers and options) added to
    the dynamic-backend keys; with ``window``, a hybrid of full-attention and
    sliding-window layers. Stopped (threads, backend) on exit."""
    hybrid = window is not None or mamba
    extra_component = [ComponentType.SWA] if window is not None else \
        [ComponentType.MAMBA] if mamba else []
    cfg = CacheConfig(page_size=page_size, num_layers=4 if hybrid else 2,
                      components=(ComponentType.FULL, *extra_component),
                      full_attention_layer_ids=(1, 3) if hybrid else (0, 1),
                      sliding_window_size=window, kv_size=256, head_num=2, head_dim=8,
                      enable_mamba_extra_buffer=mamba and page_size > 1, mamba_cache_size=60)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(kit, "get_device", lambda *a, **k: "cpu"))
        _unpinned(stack)
        stack.enter_context(get_parallel().override(tp_rank=tp[0], tp_size=tp[1], pp_rank=0,
                                                    pp_size=1))
        tree, allocator, rtp = kit.build_fixture(cfg)
        args = ServerArgs(
            model_path="dummy", page_size=page_size, hicache_io_backend="direct",
            hicache_mem_layout=layout, hicache_write_policy="write_through",
            hicache_storage_backend="dynamic",
            hicache_storage_backend_extra_config=json.dumps(
                {**BACKEND, "prefetch_threshold": 1, **extra}),
            hicache_storage_prefetch_policy="wait_complete")
        set_global_server_args_for_scheduler(args)
        tree.init_hicache(args, tree.cache_init_params)
        kit.drop_hicache_atexit_pin(tree)
        stack.callback(tree.release_host_resources)
        tree.write_through_threshold = 1 << 30
        tree.load_back_threshold = 0
        cc = tree.cache_controller
        cc.prefetch_capacity_limit = max(cc.prefetch_capacity_limit, cc.mem_pool_host.size)
        stack.callback(lambda: cc.storage_backend.close())
        stack.callback(cc._stop_storage_threads)
        yield Cache(tree, allocator, rtp, cfg)


def insert(cache: Cache, tokens: list[int]) -> Any:
    """Insert ``tokens`` on the device and give every node of its path host pages (the
    kit's simulated device-to-host backup); the leaf node."""
    params = InsertParams(key=RadixKey(array("q", tokens)), value=alloc(cache, len(tokens)))
    if ComponentType.MAMBA in cache.cfg.components:
        fixtures = UnifiedRadixCacheFixtures()
        fixtures.cfg = cache.cfg
        req = fixtures._make_req(cache.req_to_token_pool)
        params.mamba_value = req.kv.mamba_pool_idx.unsqueeze(0)
    cache.tree.insert(params)
    leaf = kit.match_prefix(cache.tree, tokens).last_device_node
    for node in path(cache, leaf):
        for component in cache.cfg.components:
            value = kit.node_device_value(cache.tree, node, component)
            if value is not None and kit.node_host_value(cache.tree, node, component) is None:
                cache.tree.tree_core.set_component_host_value_raw(node, component,
                                                                  value.clone())
        cache.tree.tree_core.update_duplicate_tracking(node)
    return leaf


def alloc(cache: Cache, num_tokens: int) -> torch.Tensor:
    """Device slots for ``num_tokens`` (the SWA allocator's own ``alloc`` takes one-token
    pages only; this is the kit's ``_alloc``: full and sliding slots, mapped)."""
    allocator = cache.allocator
    if ComponentType.SWA not in cache.cfg.components:
        return allocator.alloc(num_tokens)
    full = allocator.full_attn_allocator.alloc(num_tokens)
    allocator.full_to_swa_index_mapping[full] = allocator.swa_attn_allocator.alloc(num_tokens)
    return full


def path(cache: Cache, node: Any) -> list[Any]:
    chain = []
    while node != cache.tree.root_node_handle():
        chain.append(node)
        node = kit.node_parent(cache.tree, node)
    return chain[::-1]


def host_indices(cache: Cache, leaf: Any) -> torch.Tensor:
    return torch.cat([kit.node_host_value(cache.tree, n, ComponentType.FULL)
                      for n in path(cache, leaf)])


def fill_host(cache: Cache, indices: torch.Tensor, seed: int) -> list[bytes]:
    """Random bytes in every KV host page at ``indices``; each page's bytes, in order."""
    return fill_pool(cache.host, indices, cache.cfg.page_size, seed)


def fill_pool(pool: Any, indices: torch.Tensor, page_size: int, seed: int) -> list[bytes]:
    """Random bytes in every page of host pool ``pool`` at ``indices``; each page's bytes."""
    gen = torch.Generator().manual_seed(seed)
    pages = []
    for start in indices[::page_size].tolist():
        dummy = pool.get_dummy_flat_data_page()
        raw = dummy.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
        pool.set_from_flat_data_page(start, dummy)
        pages.append(page_bytes_of(pool, start))
    return pages


def page_bytes_of(pool: Any, start: int) -> bytes:
    page = pool.get_data_page(start, flat=True).contiguous()
    return page.view(torch.uint8).numpy().tobytes()


def host_page(cache: Cache, start: int) -> bytes:
    return page_bytes_of(cache.host, start)


def back_up(cache: Cache, leaf: Any, timeout_s: float = 30.0) -> None:
    """Write every node of ``leaf``'s path to storage on the controller's backup thread,
    and wait (bounded) for its acknowledgements."""
    for node in path(cache, leaf):
        cache.tree.write_backup_storage(node)
    pump(cache, lambda: not cache.tree.ongoing_backup, "backups did not finish", timeout_s)


def prefetch(cache: Cache, tokens: list[int], rid: str, timeout_s: float = 30.0) -> int:
    """Prefetch ``tokens`` from storage on the controller's threads, to completion; the
    tokens the prefetch brought into host memory."""
    req = CacheRequestHandle(rid, 0)
    cache.tree.prefetch_from_storage(req, cache.tree.root_node_handle(), array("q", tokens),
                                     None, None)
    pump(cache, lambda: cache.tree.check_prefetch_progress(req), "prefetch did not finish",
         timeout_s)
    return int(kit.match_prefix(cache.tree, tokens).host_hit_length)


def pump(cache: Cache, done: Callable[[], bool], what: str, timeout_s: float) -> None:
    """Run the scheduler's event round until ``done()``; a bounded poll of real threads."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cache.tree.check_hicache_events()
        if done():
            return
        time.sleep(0.01)
    raise AssertionError(what)


def prefetched_pages(cache: Cache, tokens: list[int]) -> list[bytes]:
    """The host pages of ``tokens``' matched path (what a prefetch brought)."""
    node = kit.match_prefix(cache.tree, tokens).last_host_node
    if not tokens or node == cache.tree.root_node_handle():
        return []
    idx = host_indices(cache, node)
    return [host_page(cache, s) for s in idx[:: cache.cfg.page_size].tolist()]
