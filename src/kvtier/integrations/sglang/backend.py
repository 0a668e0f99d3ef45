"""SGLang's HiCache L3 storage over kvtier's disk and Redis tiers: the core and the KV pool.

SGLang builds it as ``cls(storage_config, kwargs)`` (``--hicache-storage-backend dynamic``
with ``module_path`` ``kvtier.integrations.sglang`` and ``class_name``
``KvtierHiCacheStorage``), registers its host pools, then calls it from its prefetch and
backup threads. The tiers open once the pools are known (``on_host_pools_registered``, or
the first call): their slot is the largest page of any pool, and every rank opens its own
disk directory ``<disk.path>/<shard>`` (one process per directory).

Every method answers, within ``deadline_s`` (``kvtier.tiers.pages``): a tier that fails,
stalls or holds a bad record costs a miss, and an unexpected error is logged and counted as
a miss too (``errors`` in ``stats()``); nothing raises into SGLang's threads. The v2
methods (hybrid models) are in ``kvtier.integrations.sglang.hybrid``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from kvtier.integrations.sglang.keys import PageNamespace, namespace_of
from kvtier.integrations.sglang.metrics import MetricsServer
from kvtier.integrations.sglang.options import SglangOptions
from kvtier.integrations.sglang.pools import HostPool, fill, fill_page, page_bytes, read_page
from kvtier.integrations.sglang.pools import host_pool as make_pool
from kvtier.tiers.lower import Item
from kvtier.tiers.pages import PageTiers

_log = logging.getLogger(__name__)
T = TypeVar("T")
KV = "kv"


class KvtierStorageCore(HiCacheStorage):
    """Options, pools and tiers, and the guard every call goes through (module docstring).

    ``tiers``: prebuilt lower tiers in place of the configured ones (tests inject faults)."""

    def __init__(self, storage_config: Any, kwargs: Any = None, *,
                 tiers: Sequence[Any] | None = None) -> None:
        self.options = SglangOptions.from_extra_config(storage_config.extra_config)
        self.storage_config = storage_config
        self.pools: dict[str, HostPool] = {}
        self.namespace: PageNamespace | None = None
        self._hosts: dict[str, Any] = {}
        self._injected = tiers
        self._pages: PageTiers | None = None
        self._open_lock = threading.Lock()
        self._metrics: MetricsServer | None = None
        self.errors = 0
        """Calls that raised inside kvtier (logged) and were answered as misses."""

    # ---- registration and opening ------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._hosts.setdefault(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        self._hosts[name] = host_pool
        if self._pages is not None and self.namespace is not None:  # a later sidecar
            self.pools[name] = make_pool(name, host_pool, self.namespace)

    def on_host_pools_registered(self) -> None:
        self.pages()

    def pages(self) -> PageTiers:
        """The tiers, opened on first use (once every pool registered so far is known)."""
        with self._open_lock:
            if self._pages is None:
                self._pages = self._open()
            return self._pages

    def _open(self) -> PageTiers:
        anchor = self._hosts.get(KV)
        if anchor is None:
            raise ValueError("kvtier SGLang backend: no host pool registered "
                             "(register_mem_pool_host) before the first call")
        ns = namespace_of(self.storage_config, str(getattr(anchor, "layout", "")),
                          int(getattr(anchor, "page_size", 1) or 1),
                          str(getattr(anchor, "dtype", "")),
                          revision=self.options.model_revision, salt=self.options.tenant_salt)
        self.namespace = ns
        self.pools = {n: make_pool(n, h, ns) for n, h in self._hosts.items()}
        slot = max(p.pool.page_bytes for p in self.pools.values())
        config = self.options.tiers
        if config.disk is not None:
            disk = dataclasses.replace(config.disk, path=str(Path(config.disk.path) / ns.shard()))
            config = dataclasses.replace(config, disk=disk)
        pages = PageTiers(config, slot, ns.geometry(), deadline_s=self.options.deadline_s,
                          tiers=self._injected)
        if self.options.metrics_port is not None:
            self._metrics = MetricsServer(pages, self.options.metrics_port + _rank_index(ns))
        _log.info("kvtier: HiCache storage over %s, pages up to %d bytes, shard %s",
                  [t.name for t in pages.lower], slot, ns.shard())
        return pages

    # ---- the guard -----------------------------------------------------------------------

    def guarded(self, what: str, miss: Callable[[], T], call: Callable[[], T]) -> T:
        """``call()``, or, if it raises, the miss ``miss()`` (logged and counted)."""
        try:
            return call()
        except Exception:
            self.errors += 1
            _log.exception("kvtier: %s failed; answered as a miss", what)
            return miss()

    def pool(self, name: str) -> HostPool | None:
        """The registered pool ``name`` (its page must fit the tiers' slots), or None."""
        self.pages()
        found = self.pools.get(str(name))
        if found is not None and found.pool.page_bytes > self.pages().slot_bytes:
            _log.warning("kvtier: pool %s pages (%d bytes) exceed the tiers' slots (%d): "
                         "registered after the tiers opened; not stored", name,
                         found.pool.page_bytes, self.pages().slot_bytes)
            return None
        return found

    # ---- reads and writes between pools and tiers ----------------------------------------

    def read_into(self, pool: HostPool, hashes: Sequence[str],
                  indices: Sequence[int]) -> list[bool]:
        """Fetch ``hashes`` into the pool pages at ``indices``; per page, whether it came."""
        keys = [pool.key(h) for h in hashes]
        got = self.pages().get(keys)
        return [k in got and fill_page(pool, i, got[k]) for k, i in zip(keys, indices, strict=True)]

    def write_from(self, batches: Sequence[tuple[HostPool, Sequence[str], Sequence[int]]]
                   ) -> list[list[bool]]:
        """Store the pool pages at the indices, under their hashes, in one tier call; per
        batch, per page, whether it is stored (or admission declined it)."""
        items: list[Item] = []
        for pool, hashes, indices in batches:
            items += [(pool.key(h), read_page(pool, i))
                      for h, i in zip(hashes, indices, strict=True)]
        done = iter(self.pages().put(items))
        return [[next(done) for _ in hashes] for _, hashes, _ in batches]

    # ---- statistics and life cycle ---------------------------------------------------------

    def stats(self) -> dict[str, dict[str, Any]]:
        """kvtier's counters: each tier's (``TierStats``) and the backend's own."""
        if self._pages is None:
            return {"sglang": {"errors": self.errors}}
        out = self._pages.stats()
        out["sglang"] = {"errors": self.errors}
        return out

    def get_stats(self) -> None:
        """SGLang's ``StorageMetrics`` come from its controller; kvtier's are ``stats()``
        and, with ``metrics_port``, Prometheus."""
        return None

    def clear(self) -> bool:
        """Not supported (the tiers evict by capacity, Redis by its policy or ``ttl_s``)."""
        _log.warning("kvtier: clear() is not supported; pages leave by the tiers' eviction")
        return False

    def close(self) -> None:
        """Finish queued writes and release the tiers (a disk tier its directory)."""
        if self._metrics is not None:
            self._metrics.close()
        with self._open_lock:
            pages, self._pages = self._pages, None
        if pages is not None:
            pages.close()


def _rank_index(ns: PageNamespace) -> int:
    """This rank's offset from ``metrics_port``: distinct for every tp, pp, cp rank."""
    (t, ts), (p, ps), (c, _) = ns.tp, ns.pp, ns.cp
    return t + ts * (p + ps * c)


class KvtierKvStorage(KvtierStorageCore):
    """The KV pool's methods (module docstring); ``KvtierHiCacheStorage`` adds the hybrid
    pools' (``kvtier.integrations.sglang.hybrid``)."""

    # ---- existence -----------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """The leading run of KV pages some tier holds."""
        return self.guarded("batch_exists", lambda: 0, lambda: self._kv_run(keys))

    def _kv_run(self, keys: list[str]) -> int:
        pool = self.pool(KV)
        return 0 if pool is None else self.pages().exists([pool.key(h) for h in keys])

    # ---- zero copy (interface_v1) ----------------------------------------------------------

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> list[bool]:
        return self.guarded("batch_get_v1", lambda: [False] * len(keys),
                            lambda: self._get_v1(keys, host_indices))

    def _get_v1(self, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        pool = self.pool(KV)
        if pool is None:
            return [False] * len(keys)
        return self.read_into(pool, keys, [pool.index(host_indices, i) for i in range(len(keys))])

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> list[bool]:
        return self.guarded("batch_set_v1", lambda: [False] * len(keys),
                            lambda: self._set_v1(keys, host_indices))

    def _set_v1(self, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        pool = self.pool(KV)
        if pool is None:
            return [False] * len(keys)
        indices = [pool.index(host_indices, i) for i in range(len(keys))]
        return self.write_from([(pool, keys, indices)])[0]

    # ---- the legacy calls: flat page tensors -----------------------------------------------

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None
            ) -> torch.Tensor | None:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[torch.Tensor | None]:
        return self.guarded("batch_get", lambda: [None] * len(keys),
                            lambda: self._get_pages(keys, target_locations))

    def _get_pages(self, keys: list[str], targets: Any) -> list[torch.Tensor | None]:
        pool = self.pool(KV)
        if pool is None:
            return [None] * len(keys)
        ks = [pool.key(h) for h in keys]
        got = self.pages().get(ks)
        out: list[torch.Tensor | None] = []
        for i, k in enumerate(ks):
            target = targets[i] if targets is not None and targets[i] is not None \
                else pool.host.get_dummy_flat_data_page()
            out.append(target if k in got and fill(target, got[k]) else None)
        return out

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        return self.guarded("batch_set", lambda: False, lambda: self._set_pages(keys, values))

    def _set_pages(self, keys: list[str], values: Any) -> bool:
        pool = self.pool(KV)
        if pool is None or values is None or len(values) != len(keys):
            return False
        items: list[Item] = [(pool.key(h), page_bytes(v)) for h, v in zip(keys, values,
                                                                          strict=True)]
        if any(len(p) != pool.pool.page_bytes for _, p in items):
            _log.warning("kvtier: batch_set was given a page that is not one %s page", KV)
            return False
        return all(self.pages().put(items))
