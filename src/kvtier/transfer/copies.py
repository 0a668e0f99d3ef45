"""What the data plane is asked to do, and what it answers.

* :class:`GroupKV` registers one group's per-layer KV tensors, as the engine allocated them.
* :class:`ChunkCopy` asks to move some blocks of one chunk between the engine and a slot.
* :class:`JobResult` says how a submitted job (many copies) ended.

Slot byte layout (one chunk of group ``g``, ``B`` blocks per slot, layers ``0..L-1``):
``B = blocks_per_chunk`` for attention groups and ``B = 1`` for ``state`` groups (the block
holding the state after the chunk's last token). The slot's first ``chunk_bytes`` bytes are
layer-major::

    [layer 0: block 0 | block 1 | ... | block B-1][layer 1: block 0 | ...] ... [layer L-1: ...]

each block being that layer's ``bytes_per_block`` bytes in the order of a
``[num_blocks, 2, ...]`` tensor: K then V. A ``[2, num_blocks, ...]`` (block axis 1) tensor
stores block ``b`` as ``t[0, b]`` bytes then ``t[1, b]`` bytes, which is the same order, so
slot bytes do not depend on the engine's block axis. Bytes past ``chunk_bytes`` (slots are
as large as the layout's largest chunk) are never read or written.

Example: two layers of ``[num_blocks, 2, 16, 1, 8]`` fp16 (512 bytes per block) and
4 blocks per chunk: ``chunk_bytes`` is 4096; layer 1's block 2 lives at bytes 3072..3583.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

import numpy as np
import torch

Slot: TypeAlias = torch.Tensor | np.ndarray
"""A slot buffer: a 1-D, contiguous, uint8 CPU tensor (pinned on CUDA hosts) or ndarray."""

SlotRef: TypeAlias = Slot | int
"""What a copy names its slot by: a buffer, or the index of a row of the slab registered
with the engine (``TransferEngine(..., slab=rows)``), the faster way (no buffer per copy to
check)."""

Direction = Literal["store", "load"]


@dataclass(frozen=True)
class GroupKV:
    """The KV tensors of one group: one per layer, all with the same number of blocks.

    ``block_axis`` is where the block dimension is: 0 for ``[num_blocks, 2, block, heads,
    dim]``, 1 for ``[2, num_blocks, block, heads, dim]``. ``token_axis`` is the dimension
    that must equal the group's ``tokens_per_block`` (2 in both shapes above; 1 for an MLA
    cache ``[num_blocks, block, dim]``); it is not checked for ``state`` groups.

    Example: ``GroupKV((k0, k1), block_axis=1)`` with ``k0.shape == (2, 100, 16, 8, 64)``.
    """

    layers: tuple[torch.Tensor, ...]
    """The group's per-layer tensors, in the engine's layer order (slot order)."""
    block_axis: Literal[0, 1] = 0
    """Axis of the block dimension: 0 or 1."""
    token_axis: int = 2
    """Axis whose size is the group's ``tokens_per_block`` (attention groups only)."""

    def __post_init__(self) -> None:
        if not isinstance(self.layers, tuple):
            object.__setattr__(self, "layers", tuple(self.layers))
        if self.block_axis not in (0, 1):
            raise ValueError(f"GroupKV: block_axis must be 0 or 1, got {self.block_axis!r}")


@dataclass(frozen=True, eq=False, slots=True)
class ChunkCopy:
    """Move engine blocks ``block_ids`` to or from chunk-relative blocks of ``slot``.

    Engine block ``block_ids[i]`` corresponds to block ``first_block + i`` of the chunk held
    in ``slot``. A store writes only those blocks' bytes into the slot; a load writes only
    those engine blocks.

    Example: a sliding-window chunk of 4 blocks of which only the last is live
    (``BlockRun(chunk=1, first_block=3, num_blocks=1)``, engine block 42):
    ``ChunkCopy(group=1, slot=slab[7], block_ids=(42,), first_block=3)``, or ``slot=7``
    when ``slab`` is registered with the engine.
    """

    group: int
    """Index of the group in the layout."""
    slot: SlotRef
    """The slot holding the chunk (its prefix of ``chunk_bytes`` bytes): a buffer, or a row
    index of the engine's registered slab."""
    block_ids: tuple[int, ...]
    """Engine block ids, in chunk order."""
    first_block: int = 0
    """Chunk-relative index of the block ``block_ids[0]`` corresponds to."""

    def __post_init__(self) -> None:
        ids = tuple(int(b) for b in self.block_ids)
        object.__setattr__(self, "block_ids", ids)
        if not ids:
            raise ValueError("ChunkCopy: block_ids must name at least one block")
        if min(ids) < 0:
            raise ValueError(f"ChunkCopy: block ids must be >= 0, got {list(ids)}")
        if self.first_block < 0:
            raise ValueError(f"ChunkCopy: first_block must be >= 0, got {self.first_block}")
        slot = self.slot
        if type(slot) is not int and isinstance(slot, (int, np.integer, np.bool_)):
            if isinstance(slot, (bool, np.bool_)):
                raise ValueError("ChunkCopy: slot must be a buffer or a slab row index, "
                                 "got a bool")
            object.__setattr__(self, "slot", int(slot))  # numpy integers, as plain ints

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids)


@dataclass(frozen=True)
class JobResult:
    """How one job ended. On failure ``error`` holds the exception that ended it.

    A failed store leaves its slots' contents unspecified: free them, never publish them.
    A failed load leaves every destination block of the job unspecified, including blocks
    of copies that ran before the failure: treat them as garbage and recompute them.
    """

    job_id: int
    direction: Direction
    ok: bool
    error: BaseException | None = field(default=None, compare=False)


def as_copies(copies: Sequence[ChunkCopy] | ChunkCopy) -> list[ChunkCopy]:
    """A list of copies from one copy or a sequence of them; rejects anything else."""
    items = [copies] if isinstance(copies, ChunkCopy) else list(copies)
    for c in items:
        if not isinstance(c, ChunkCopy):
            raise ValueError(f"expected ChunkCopy objects, got {type(c).__name__}")
    return items
