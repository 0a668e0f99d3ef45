"""What the replay's store asks of a lower tier beyond ``LowerTier``, as protocols checked
at run time.

They live in a module of their own, never compiled: ``@runtime_checkable`` applies to
interpreted protocol classes only, and ``kvtier.replay.store`` is compiled in the serving
build (setup.py, ``COMPILED``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from kvtier.keys import ChunkKey


@runtime_checkable
class Sized(Protocol):
    """A lower tier with a slot count (``DiskTier``, ``MetadataTier``)."""

    @property
    def capacity_chunks(self) -> int: ...


@runtime_checkable
class Exact(Protocol):
    """A lower tier that answers exactly, in one call, which keys it holds (``RedisTier``,
    ``MetadataTier``); for the others ``might_hold`` is exact (``DiskTier``'s index)."""

    def exists(self, keys: Sequence[ChunkKey]) -> list[bool]: ...


@runtime_checkable
class Counting(Protocol):
    """A lower tier that can count a use of a chunk without reading it (``MetadataTier``)."""

    def touch(self, keys: Iterable[ChunkKey]) -> int: ...
