"""The paired store protocol as a type: what the planner needs from a store.

``ChunkStore`` (one tier) and ``TieredStore`` (host memory above disk and Redis) both
satisfy it, so the planner drives either unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from kvtier.keys import ChunkKey
from kvtier.store.results import (
    ChunkState,
    LoadHandle,
    StoreHandle,
    StoreRefusal,
    Subscriber,
)


@runtime_checkable
class StoreProtocol(Protocol):
    """``lookup``, ``prepare_load``/``complete_load``, ``prepare_store``/``complete_store``,
    ``touch``, ``remove``, events, and the one lock callers may hold across calls."""

    @property
    def lock(self) -> threading.RLock: ...

    def lookup(self, keys: Iterable[ChunkKey]) -> list[ChunkState]: ...

    def prepare_load(self, keys: Iterable[ChunkKey]) -> LoadHandle: ...

    def complete_load(self, handle: LoadHandle) -> None: ...

    def prepare_store(
        self, keys: Iterable[ChunkKey], parents: Sequence[ChunkKey | None] | None = None
    ) -> StoreHandle | StoreRefusal: ...

    def complete_store(self, handle: StoreHandle, ok: bool) -> None: ...

    def touch(self, keys: Iterable[ChunkKey]) -> int: ...

    def remove(self, keys: Iterable[ChunkKey]) -> list[ChunkKey]: ...

    def subscribe(self, callback: Subscriber) -> Callable[[], None]: ...

    def check_invariants(self) -> None: ...
