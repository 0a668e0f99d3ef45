"""SGLang's host pools as kvtier sees them: page bytes out, verified bytes in.

A host pool (``HostKVCache``) hands out a page as a flat tensor (``get_data_page(index,
flat=True)``) and takes one back (``set_from_flat_data_page``); the tensor's dtype is the
pool's, its bytes are the page. Going down, the bytes are copied at once
(``page_bytes``): the tiers write on their own threads, and SGLang may reuse the host
page as soon as the call returns, so a record must never be computed over memory that is
changing. Coming up, a payload reaches the pool only if it has exactly the pool's page
size (``fill_page``); the tiers have verified its record already.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvtier.integrations.sglang.keys import PageNamespace, PagePool
from kvtier.keys import ChunkKey

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostPool:
    """One registered host pool: the pool, its page format and its key tag."""

    name: str
    host: Any
    """SGLang's ``HostKVCache`` (or a pool group's anchor)."""
    pool: PagePool
    tag: bytes
    page_size: int
    """Tokens per page: page ``i`` of a call starts at ``host_indices[i * page_size]``."""

    def key(self, page_hash: str) -> ChunkKey:
        return PageNamespace.key(self.tag, page_hash)

    def index(self, host_indices: torch.Tensor, i: int) -> int:
        """The host index where the call's page ``i`` starts."""
        return int(host_indices[i * self.page_size])


def describe(name: str, host: Any) -> PagePool:
    """``host``'s page format (bytes from its dummy page: what a stored page must be)."""
    dummy = host.get_dummy_flat_data_page()
    return PagePool(name, int(dummy.numel() * dummy.element_size()), str(dummy.dtype),
                    str(getattr(host, "layout", "")))


def host_pool(name: str, host: Any, namespace: PageNamespace) -> HostPool:
    pool = describe(name, host)
    return HostPool(name, host, pool, namespace.tag(pool),
                    int(getattr(host, "page_size", 1) or 1))


def page_bytes(page: torch.Tensor) -> bytes:
    """A copy of a page tensor's bytes (any dtype, bfloat16 included)."""
    flat = page.detach().contiguous().reshape(-1).cpu()
    return flat.view(torch.uint8).numpy().tobytes()


def read_page(pool: HostPool, index: int) -> bytes:
    """A copy of the page at host ``index``."""
    return page_bytes(pool.host.get_data_page(index, flat=True))


def fill(target: torch.Tensor, payload: memoryview) -> bool:
    """Copy ``payload`` into the flat tensor ``target``; False (nothing written) unless
    their sizes agree."""
    raw = target.view(torch.uint8)
    if raw.numel() != payload.nbytes:
        _log.warning("kvtier: a stored page has %d bytes, the pool's pages %d: a miss",
                     payload.nbytes, raw.numel())
        return False
    raw.numpy()[:] = np.frombuffer(payload, dtype=np.uint8)
    return True


def fill_page(pool: HostPool, index: int, payload: memoryview) -> bool:
    """Write ``payload`` into the host page at ``index``; False unless it is one page."""
    page = pool.host.get_dummy_flat_data_page()
    if not fill(page, payload):
        return False
    pool.host.set_from_flat_data_page(index, page)
    return True
