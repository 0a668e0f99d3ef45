"""A request as the engine and its offloader see it, and the result it ends with."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from kvtier.engine.blocks import BlockTable

#: Per group (group outermost), per logical block: the physical block id, or None where the
#: request holds no block (not allocated, or freed because it left the retained span).
BlockTables = tuple[tuple[int | None, ...], ...]

#: Per group (group outermost): physical block ids.
BlockIds = tuple[tuple[int, ...], ...]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    """Added, not admitted: no blocks, no offloader call yet."""
    LOADING = "loading"
    """Admitted with a hit; the offloader is filling its blocks."""
    RUNNING = "running"
    """Computing: prefill pieces, then one token per step."""
    FINISHED = "finished"
    """Produced ``max_tokens`` tokens; every block returned to the pool."""


@dataclass
class Request:
    """One generation request. The engine alone mutates it; offloaders only read it.

    Token ``i`` of ``all_token_ids`` is at position ``i``. ``num_computed_tokens`` is the
    horizon: positions ``[0, num_computed_tokens)`` have KV (computed, or restored by the
    offloader). The last generated token has no KV until the next step computes it.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_restored_tokens: int = 0
    """Leading tokens the offloader restored (0 after a failed load)."""
    status: RequestStatus = RequestStatus.WAITING
    block_tables: list[BlockTable] = field(default_factory=list)
    output_logits: list[torch.Tensor] = field(default_factory=list)
    num_drafted_tokens: int = 0
    """Draft tokens proposed and verified (speculative decoding)."""
    num_accepted_tokens: int = 0
    """Drafts the target accepted."""
    num_reprefilled_tokens: int = 0
    """Draft KV positions rewound and recomputed because they read a rejected draft."""

    @property
    def all_token_ids(self) -> tuple[int, ...]:
        return self.prompt_token_ids + tuple(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def tables_snapshot(self) -> BlockTables:
        return tuple(t.snapshot() for t in self.block_tables)


@dataclass(frozen=True)
class Completion:
    """What a finished request produced.

    ``logits[i]`` are the logits ``output_token_ids[i]`` was chosen from (greedy argmax).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    logits: torch.Tensor
    num_restored_tokens: int
    num_drafted_tokens: int = 0
    """Draft tokens proposed and verified (0 without speculative decoding)."""
    num_accepted_tokens: int = 0
    """Drafts the target accepted."""
    num_reprefilled_tokens: int = 0
    """Draft KV positions rewound and recomputed after rejections (up to ``k - 1`` a step)."""

    @property
    def num_rejected_tokens(self) -> int:
        return self.num_drafted_tokens - self.num_accepted_tokens

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted; 0.0 when nothing was drafted."""
        if not self.num_drafted_tokens:
            return 0.0
        return self.num_accepted_tokens / self.num_drafted_tokens
