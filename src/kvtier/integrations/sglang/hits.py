"""SGLang's rule for a hybrid model's storage hit, over which pages the tiers hold.

A hybrid model's prefix needs more than its KV pages: SGLang asks ``batch_exists_v2`` for
the KV pages of a span and, per extra pool, a ``PoolTransfer`` with a hit policy:

* ``all_pages``: every page of the prefix (a DSA indexer pool);
* ``trailing_pages``: only the last ``n`` pages before the prefix's end, ``n`` the number of
  keys the transfer carries (``ceil(window / page_size)`` for sliding-window layers, 1 for
  Mamba state): a prefix of ``p`` pages is restorable when pages ``p - n .. p - 1`` are held;
* ``block_groups``: the pages its leading complete groups cover, reported as the pool's own
  verdict; it never limits the KV hit.

The answer (``fold``) is the longest prefix restorable in every pool, each pool's own
boundary, and every restorable length (a trailing pool can make 5 pages restorable while 4
are not; SGLang intersects these sets across ranks). This is the rule SGLang's own file
backend applies (``HiCacheFile.batch_exists_v2``); docs/sglang.md compares it with
kvtier's coverage contract.

>>> swa = PoolQuery("swa", "trailing_pages", [True, True, False, True, True], trailing=2)
>>> f = fold([True] * 5, [swa])
>>> f.final, f.pool_pages, f.restorable
(5, {'kv': 5, 'swa': 5}, [1, 2, 5])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

POLICIES = ("all_pages", "trailing_pages", "block_groups")


@dataclass(frozen=True)
class PoolQuery:
    """One extra pool of a hit query: which of the span's pages it holds, and its policy."""

    name: str
    policy: str
    held: Sequence[bool]
    """Per page of the span (the KV keys' order): whether this pool's page is held."""
    trailing: int = 1
    """``trailing_pages``: pages needed before the prefix's end (at least 1)."""
    group_pages: int = 0
    """``block_groups``: pages per group."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"pool {self.name!r}: hit policy must be one of {list(POLICIES)}, "
                             f"got {self.policy!r}")


@dataclass(frozen=True)
class Fold:
    """A hybrid hit: ``final`` pages usable, each pool's boundary, every restorable length."""

    final: int
    pool_pages: dict[str, int] = field(default_factory=dict)
    restorable: list[int] = field(default_factory=list)


def fold(kv_held: Sequence[bool], pools: Sequence[PoolQuery]) -> Fold:
    """The longest prefix every pool can restore (module docstring)."""
    kv = _run(kv_held)
    hits: dict[str, int] = {"kv": kv} if kv else {}
    restorable = set(range(1, kv + 1))
    for pool in pools:
        if not restorable:
            break
        own, boundary = _restorable(pool, kv)
        if boundary:
            hits[pool.name] = boundary
        restorable &= own
    ordered = sorted(restorable)
    return Fold(ordered[-1] if ordered else 0, hits, ordered)


def _restorable(pool: PoolQuery, kv: int) -> tuple[set[int], int]:
    """The prefix lengths (up to ``kv``) ``pool`` can restore, and its own boundary."""
    held = list(pool.held[:kv])
    if pool.policy == "all_pages":
        run = _run(held)
        return set(range(1, run + 1)), run
    if pool.policy == "block_groups":
        group = max(1, pool.group_pages)
        return set(range(1, kv + 1)), _run(held) // group * group
    n = max(1, pool.trailing)
    own = {p for p in range(1, kv + 1) if all(held[max(0, p - n):p])}
    return own, max(own, default=0)


def _run(held: Sequence[bool]) -> int:
    """The leading run of True."""
    for i, h in enumerate(held):
        if not h:
            return i
    return len(held)
