"""SGLang page keys as kvtier ``ChunkKey``s, namespaced by everything that makes bytes differ.

SGLang names a page by a 64-hex SHA-256 chain over its tokens (seeded from the request's
``extra_key`` / ``cache_salt``), and nothing else: the same tokens give the same hash under
any model, rank or layout. A backend must add the rest. Here:

* the *deployment* (``PageNamespace``): model (with SGLang's page-format tag) and revision,
  attention tensor-parallel rank and size (left out for rank-replicated MLA KV, where one
  writer serves every rank), pipeline rank and size, context-parallel rank and size, the
  host pool's layout (a flat page of ``layer_first`` orders its bytes otherwise than one of
  ``page_first``), page size, KV dtype and a tenant salt;
* the *pool*: its name (``kv``, ``mamba``, ``swa``, ...), its page bytes, dtype and layout.

Both are hashed, with a domain string of their own, into the key's 8-byte tag; the 32-byte
digest hashes the tag with SGLang's page hash. A vLLM chunk's tag hashes other fields under
another domain (``Namespace.group_tag``), so an SGLang page never meets a vLLM chunk, and
two deployments that differ in any field never share a page. ``geometry`` (checked in every
record) fingerprints the deployment again, so a record copied under another key still fails.

>>> ns = PageNamespace(model="org/m", tp=(0, 2), pp=(0, 1), cp=(0, 1), layout="page_first",
...                    page_size=16, kv_dtype="torch.bfloat16")
>>> pool = PagePool("kv", 4096, "torch.bfloat16", "page_first")
>>> rank1 = dataclasses.replace(ns, tp=(1, 2))
>>> a = ns.key(ns.tag(pool), "ab" * 32)
>>> len(a), a == ns.key(rank1.tag(pool), "ab" * 32), a == ns.key(ns.tag(pool), "cd" * 32)
(40, False, False)
>>> mla = dataclasses.replace(ns, replicated=True)     # one copy of MLA KV serves every rank
>>> dataclasses.replace(mla, tp=(1, 2)).tag(pool) == mla.tag(pool)
True
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from kvtier.keys import ChunkKey

DOMAIN = b"kvtier-sglang-page/1"
"""Hashed first into every SGLang tag: no vLLM or engine key's tag hashes it."""


@dataclass(frozen=True)
class PagePool:
    """One host pool's page format: its name, page bytes, dtype and layout."""

    name: str
    page_bytes: int
    dtype: str
    layout: str


@dataclass(frozen=True)
class PageNamespace:
    """What must match for two SGLang processes to share a page (module docstring)."""

    model: str
    tp: tuple[int, int]
    """(rank, size) of attention tensor parallelism."""
    pp: tuple[int, int]
    cp: tuple[int, int]
    layout: str
    page_size: int
    kv_dtype: str
    revision: str = ""
    salt: str = ""
    replicated: bool = False
    """MLA: every TP rank holds the same KV (one writer), so the KV pool's tag leaves
    ``tp`` out; TP-sharded pools (Mamba state) keep it."""
    dcp: tuple[int, int] = (0, 1)

    def shard(self) -> str:
        """This rank's place among the processes sharing one configuration, as a name
        (each opens its own disk directory under it): ``tp0of2-pp0of1-cp0of1``."""
        (t, ts), (p, ps), (c, cs) = self.tp, self.pp, self.cp
        return f"tp{t}of{ts}-pp{p}of{ps}-cp{c}of{cs}"

    def geometry(self) -> bytes:
        """8 bytes fingerprinting the deployment, checked in every record read."""
        return hashlib.blake2b(DOMAIN + repr(self).encode(), digest_size=8).digest()

    def tag(self, pool: PagePool) -> bytes:
        """The 8-byte tag of ``pool``'s pages. A TP-sharded pool (Mamba state) of a
        rank-replicated model keeps its TP rank; replicated KV leaves it out."""
        ns = dataclasses.replace(self, tp=(0, 1)) if self.replicated and pool.name == "kv" \
            else self
        return hashlib.sha256(DOMAIN + repr((ns, pool)).encode()).digest()[:8]

    @staticmethod
    def key(tag: bytes, page_hash: str) -> ChunkKey:
        """The ``ChunkKey`` of SGLang page ``page_hash`` in the pool of ``tag``."""
        digest = hashlib.sha256(tag + page_hash.encode("utf-8", "surrogatepass")).digest()
        return ChunkKey(tag + digest)


def namespace_of(config: Any, layout: str, page_size: int, kv_dtype: str, *,
                 revision: str = "", salt: str = "") -> PageNamespace:
    """The namespace of SGLang's ``HiCacheStorageConfig`` ``config`` (read duck-typed)."""
    return PageNamespace(
        model=str(config.model_name or ""), tp=(int(config.tp_rank), int(config.tp_size)),
        pp=(int(config.pp_rank), int(config.pp_size)),
        cp=(int(config.attn_cp_rank), int(config.attn_cp_size)), layout=layout,
        page_size=page_size, kv_dtype=kv_dtype, revision=revision, salt=salt,
        replicated=bool(getattr(config, "is_mla_model", False)),
        dcp=(int(getattr(config, "dcp_rank", 0)), int(getattr(config, "dcp_size", 1))),
    )
