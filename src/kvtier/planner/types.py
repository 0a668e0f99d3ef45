"""What the planner hands the engine: lookup results, transfer jobs, limits and metrics.

Results are small frozen records, group outermost. A transfer job names slots by number;
the engine's data plane turns a slot number into bytes (``store.backend.view(slot)``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, NamedTuple

from kvtier.boundaries import BoundaryMode, check_mode
from kvtier.coverage import ChunkRanges
from kvtier.keys import ChunkKey


class Outcome(enum.Enum):
    HIT = "hit"
    """Restore ``hit_tokens`` tokens: accept with ``accept_hit`` once blocks are allocated."""
    MISS = "miss"
    """Nothing beyond what the engine already has; compute from ``on_device``."""
    WAIT = "wait"
    """A larger hit needs chunks still being written or loaded: ask again later."""


@dataclass(frozen=True)
class Lookup:
    """The answer to ``Planner.lookup``.

    ``hit_tokens`` is the hit ``h`` (tokens ``[0, h)`` restored, the engine computes from
    ``h``): a boundary, or one token less for a whole-prompt hit (``coverage.consumer_hit``);
    for a miss it equals the tokens the engine already has. ``chunks`` are the
    chunks to load per group (group outermost). ``wait_until`` is the deadline of a wait.
    """

    outcome: Outcome
    hit_tokens: int
    chunks: tuple[ChunkRanges, ...]
    wait_until: float | None

    def __init__(self, outcome: Outcome, hit_tokens: int, chunks: tuple[ChunkRanges, ...] = (),
                 wait_until: float | None = None) -> None:  # see ``requests.PendingHit``
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "hit_tokens", hit_tokens)
        object.__setattr__(self, "chunks", chunks)
        object.__setattr__(self, "wait_until", wait_until)

    @property
    def num_chunks(self) -> int:
        return sum(len(c) for c in self.chunks)


class PlannedCopy(NamedTuple):
    """One chunk's bytes between tier slot ``slot`` and engine blocks.

    ``block_ids[i]`` is chunk-relative block ``first_block + i`` of chunk ``chunk`` of group
    ``group``. Example: with 4 blocks per chunk, ``first_block=3, block_ids=(41,)`` moves
    the chunk's last block to or from engine block 41. A named tuple: immutable, pickled
    as a tuple, and made a few times faster than a frozen dataclass in the compiled build
    (a store job makes one per chunk).
    """

    group: int
    chunk: int
    key: ChunkKey
    slot: int
    block_ids: tuple[int, ...]
    first_block: int = 0


@dataclass(frozen=True)
class TransferJob:
    """A batch of copies in one direction for one request; complete it by ``id``."""

    id: int
    request_id: str
    direction: Literal["load", "store"]
    copies: tuple[PlannedCopy, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled through the constructor: vLLM sends it between processes, and the
        compiled build's frozen classes refuse the default pickle's attribute writes."""
        return (TransferJob, (self.id, self.request_id, self.direction, self.copies))


@dataclass(frozen=True)
class LoadResult:
    """What ``complete_load`` decided: the tokens the engine may treat as computed.

    After a failed load ``valid_tokens`` falls back to what the engine had before the hit,
    and the engine recomputes from there.
    """

    request_id: str
    ok: bool
    valid_tokens: int


@dataclass(frozen=True)
class RequestLimits:
    """Per-request limits on what the planner loads and stores."""

    max_load_tokens: int | None = None
    """At most this many tokens restored beyond what the engine already has."""
    max_store_tokens: int | None = None
    """Store only chunks that lie within the first this-many tokens."""
    store: Literal["prompt", "all", "none"] = "all"
    """``prompt``: store the prompt only; ``all``: the answer too (multi-turn chat)."""
    boundaries: BoundaryMode = "dense"
    """Which admissible boundaries the request serves as a producer (``kvtier.boundaries``):
    ``dense`` every one; ``end`` its prompt end and later ends; ``shared`` those and where
    it was seen to share a prefix. Fewer store fewer partial-window chunks."""
    prune_chunked_local: bool = False
    """With ``end`` or ``shared``: also prune chunked-local groups (store only the local
    span of each served boundary). By default they are stored as in ``dense``: every
    boundary within an attention chunk keeps a hit (``kvtier.boundaries.prunable``)."""

    def __post_init__(self) -> None:
        for name in ("max_load_tokens", "max_store_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative integer or None, got {value!r}")
        if self.store not in ("prompt", "all", "none"):
            raise ValueError(f"store must be 'prompt', 'all' or 'none', got {self.store!r}")
        check_mode(self.boundaries)
        if not isinstance(self.prune_chunked_local, bool):
            raise ValueError(
                f"prune_chunked_local must be true or false, got {self.prune_chunked_local!r}")


_NO_LOOKUPS = {o.value: 0 for o in Outcome}


@dataclass
class Metrics:
    """Counters for one request or for the whole planner."""

    lookups: dict[str, int]
    hit_tokens: int
    hit_tokens_by_tier: dict[str, int]
    chunks_loaded: int
    bytes_loaded: int
    chunks_offered: int
    """Chunks store planning chose (before the store skips those it already holds)."""
    chunks_offered_by_group: dict[int, int]
    chunks_stored: int
    chunks_not_admitted: int
    """Offered chunks the store's admission declined (``kvtier.store.admission``)."""
    bytes_stored: int
    waits: int
    deadline_expiries: int
    store_refusals: int
    load_failures: int
    store_failures: int
    corrupt_chunks_dropped: int

    def __init__(self, **counts: Any) -> None:
        """Every counter 0 (a dict empty, ``lookups`` 0 per outcome), then ``counts`` (by
        field name). Written out: see ``requests.PendingHit``."""
        self.lookups = dict(_NO_LOOKUPS)
        self.hit_tokens_by_tier, self.chunks_offered_by_group = {}, {}
        self.hit_tokens = self.chunks_loaded = self.bytes_loaded = self.chunks_offered = 0
        self.chunks_stored = self.chunks_not_admitted = self.bytes_stored = self.waits = 0
        self.deadline_expiries = self.store_refusals = self.load_failures = 0
        self.store_failures = self.corrupt_chunks_dropped = 0
        for name, value in counts.items():
            if name not in _METRIC_NAMES:
                raise TypeError(f"Metrics has no counter {name!r}; its counters: "
                                f"{', '.join(_METRIC_NAMES)}")
            setattr(self, name, value)

    def add_loaded(self, tier: str, tokens: int, chunks: int, nbytes: int) -> None:
        """A completed load: ``tokens`` restored from ``tier``, ``chunks`` of ``nbytes``."""
        self.hit_tokens += tokens
        self.hit_tokens_by_tier[tier] = self.hit_tokens_by_tier.get(tier, 0) + tokens
        self.chunks_loaded += chunks
        self.bytes_loaded += nbytes

    def add_stored(self, chunks: int, nbytes: int) -> None:
        """A completed store of ``chunks`` chunks of ``nbytes`` in all."""
        self.chunks_stored += chunks
        self.bytes_stored += nbytes

    def add(self, other: Metrics) -> None:
        """Fold ``other`` into this one (request totals into planner totals)."""
        for name, value in other._counters():
            mine = getattr(self, name)
            if isinstance(value, dict):
                for k, v in value.items():
                    mine[k] = mine.get(k, 0) + v
            else:
                setattr(self, name, mine + value)

    def as_dict(self) -> dict[str, object]:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self._counters()}

    def _counters(self) -> list[tuple[str, Any]]:
        # the fields, not vars(): a compiled dataclass has no __dict__
        return [(name, getattr(self, name)) for name in _METRIC_NAMES]


_METRIC_NAMES: Final = tuple(f.name for f in fields(Metrics))
"""``Metrics``' field names, found once (``dataclasses.fields`` walks the class)."""
