"""``KvtierHiCacheStorage``: the v2 methods, for hybrid models' extra pools.

A hybrid model (Mamba state, sliding-window layers, a DSA indexer, a draft model) keeps
pages in pools besides the KV pool. SGLang names them in ``PoolTransfer``s: ``batch_set_v2``
writes each transfer's pages (its ``keys``, at its ``host_indices``) to the pool's own keys;
``batch_get_v2`` reads them back; ``batch_exists_v2`` folds which pages every pool holds by
SGLang's hit rule (``kvtier.integrations.sglang.hits``). An extra pool's page is keyed by the
KV page hash it ends with and the pool's own tag (name, page bytes, dtype, layout), so it
never meets the KV page of the same hash. All pools of a call go to the tiers in one call.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.hicache_storage import PoolTransfer, PoolTransferResult

from kvtier.integrations.sglang.backend import KV, KvtierKvStorage
from kvtier.integrations.sglang.hits import PoolQuery, fold
from kvtier.integrations.sglang.pools import HostPool
from kvtier.keys import ChunkKey


class KvtierHiCacheStorage(KvtierKvStorage):
    """SGLang's ``HiCacheStorage`` over kvtier's lower tiers (docs/sglang.md): load it with
    ``--hicache-storage-backend dynamic`` and ``"module_path": "kvtier.integrations.sglang",
    "class_name": "KvtierHiCacheStorage"`` in the extra config."""

    def batch_exists_v2(self, keys: list[str], pool_transfers: list[PoolTransfer] | None = None,
                        extra_info: Any = None) -> PoolTransferResult:
        return self.guarded("batch_exists_v2", PoolTransferResult.empty,
                            lambda: self._exists_v2(keys, pool_transfers or []))

    def _exists_v2(self, keys: list[str], transfers: list[PoolTransfer]) -> PoolTransferResult:
        kv = self.pool(KV)
        if kv is None:
            return PoolTransferResult.empty()
        pools = [self.pool(str(t.name)) for t in transfers]
        asked: list[ChunkKey] = [kv.key(h) for h in keys]
        for pool in pools:
            if pool is not None:
                asked += [pool.key(h) for h in keys]
        held = iter(self.pages().held(asked))
        kv_held = [next(held) for _ in keys]
        queries = [PoolQuery(str(t.name), _policy(t),
                             [next(held) for _ in keys] if p is not None else [False] * len(keys),
                             trailing=len(t.keys or ()) or 1, group_pages=t.group_pages)
                   for t, p in zip(transfers, pools, strict=True)]
        result = fold(kv_held, queries)
        return PoolTransferResult(result.final, dict(result.pool_pages), result.restorable)

    def batch_get_v2(self, transfers: list[PoolTransfer],
                     extra_info: Any = None) -> dict[str, list[bool]]:
        return self.guarded("batch_get_v2", lambda: _none(transfers),
                            lambda: self._get_v2(transfers))

    def _get_v2(self, transfers: list[PoolTransfer]) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for t in transfers:
            pool, indices = self._placed(t)
            keys = list(t.keys or ())
            done = [False] * len(keys) if pool is None or indices is None \
                else self.read_into(pool, keys, indices)
            out.setdefault(str(t.name), []).extend(done)
        return out

    def batch_set_v2(self, transfers: list[PoolTransfer],
                     extra_info: Any = None) -> dict[str, list[bool]]:
        return self.guarded("batch_set_v2", lambda: _none(transfers),
                            lambda: self._set_v2(transfers))

    def _set_v2(self, transfers: list[PoolTransfer]) -> dict[str, list[bool]]:
        placed = [(t, *self._placed(t)) for t in transfers]
        written = iter(self.write_from([(pool, list(t.keys or ()), idx)
                                        for t, pool, idx in placed
                                        if pool is not None and idx is not None]))
        out: dict[str, list[bool]] = {}
        for t, pool, idx in placed:
            done = next(written) if pool is not None and idx is not None \
                else [False] * len(t.keys or ())
            out.setdefault(str(t.name), []).extend(done)
        return out

    def _placed(self, t: PoolTransfer) -> tuple[HostPool | None, list[int] | None]:
        """The transfer's pool and the host index of each of its pages; (pool, None) when
        its indices do not hold ``page_size`` entries per key (SGLang's own check)."""
        pool = self.pool(str(t.name))
        keys = t.keys or []
        if pool is None or t.host_indices is None \
                or t.host_indices.numel() != len(keys) * pool.page_size:
            return pool, None
        return pool, [pool.index(t.host_indices, i) for i in range(len(keys))]


def _policy(t: PoolTransfer) -> str:
    return str(getattr(t.hit_policy, "value", t.hit_policy))


def _none(transfers: list[PoolTransfer]) -> dict[str, list[bool]]:
    """Every page of every transfer: not done."""
    out: dict[str, list[bool]] = {}
    for t in transfers:
        out.setdefault(str(t.name), []).extend([False] * len(t.keys or ()))
    return out
