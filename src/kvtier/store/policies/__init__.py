"""Eviction policies and their registry.

Every policy implements ``kvtier.store.policies.base.Policy``: the store manager reports
inserts, accesses and removals, and asks for victims; the policy only orders candidates.

>>> sorted(POLICIES)
['arc', 'belady', 'lru', 'pfreq', 's3fifo']
>>> make_policy("lru", 8).capacity
8
>>> make_policy("belady", 2, future=["a", "b"]).name
'belady'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvtier.store.policies.arc import ARC
from kvtier.store.policies.base import Policy
from kvtier.store.policies.belady import Belady
from kvtier.store.policies.lru import LRU
from kvtier.store.policies.pfreq import PrefixFrequency
from kvtier.store.policies.s3fifo import S3FIFO

POLICIES: dict[str, Callable[..., Policy]] = {
    LRU.name: LRU,
    ARC.name: ARC,
    S3FIFO.name: S3FIFO,
    PrefixFrequency.name: PrefixFrequency,
    Belady.name: Belady,
}
"""Policy name -> factory taking ``(capacity, **options)``."""

ONLINE_POLICIES: tuple[str, ...] = (LRU.name, ARC.name, S3FIFO.name, PrefixFrequency.name)
"""Policies that need no knowledge of the future."""


def make_policy(name: str, capacity: int, **options: Any) -> Policy:
    """Build the policy registered as ``name`` over ``capacity`` slots.

    ``options`` go to its constructor: ``future=`` for ``belady``; ``small_ratio=`` and
    ``move_to_main_at=`` for ``s3fifo``.
    """
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown eviction policy {name!r}; known policies: {sorted(POLICIES)}")
    try:
        return factory(capacity, **options)
    except TypeError as e:
        raise ValueError(f"eviction policy {name!r}: bad options {sorted(options)}: {e}") from None


__all__ = [
    "ARC", "LRU", "ONLINE_POLICIES", "POLICIES", "S3FIFO", "Belady", "Policy", "PrefixFrequency",
    "make_policy",
]
