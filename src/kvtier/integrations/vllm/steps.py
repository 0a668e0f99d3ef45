"""What the scheduler half of the vLLM connector (``scheduler``) takes and gives once a
step, in plain data: a scheduled request's part of the step (``StepRequest``) and what the
workers do in it (``StepPlan``, which vLLM sends them as the connector's metadata)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvtier.integrations.vllm.tiers import Demotion, Promotion
from kvtier.planner import TransferJob

BlockIds = Sequence[int]


class StepRequest(NamedTuple):
    """One request's part of a vLLM step, as the connector sees it (a named tuple: built
    for every scheduled request of every step, at a third of a frozen dataclass's cost).

    ``block_ids`` per group are vLLM's ids (0 is vLLM's null block); ``full_table`` says
    they replace the request's table (new and resumed requests) rather than extend it.
    ``horizon`` is how many tokens have KV once this step's forward ran, and ``tokens``
    every token id known (prompt and verified output). A state group's table is not vLLM's
    (``kvtier.integrations.vllm.state``): ``state_blocks`` are its entries this step's
    forward fills, ``(group, position, block_id)``.
    """

    request_id: str
    block_ids: tuple[BlockIds, ...] | None
    full_table: bool
    horizon: int
    tokens: Sequence[int]
    state_blocks: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class StepPlan:
    """What the workers do this step: loads before the forward, stores after it, and the
    store jobs to finish before any block is overwritten; with lower tiers, the chunks to
    write down before any slot is reused and the promotions into host slots
    (``kvtier.integrations.vllm.tiers``). ``idle``: vLLM scheduled no request this step
    (it steps only because a request waits, e.g. for a promotion). ``sync``: the ids of the
    loads vLLM scheduled as synchronous, whose requests compute in this step's forward:
    the workers finish them before it, and report a failed one by its blocks.
    ``after_sync``: ``(store job, synchronous load)`` for each store of KV computed over a
    synchronous load not yet confirmed: a worker whose load failed drops the store."""

    loads: tuple[TransferJob, ...] = ()
    stores: tuple[TransferJob, ...] = ()
    flush: tuple[int, ...] = ()
    promotes: tuple[Promotion, ...] = ()
    demotions: tuple[Demotion, ...] = ()
    idle: bool = False
    sync: tuple[int, ...] = ()
    after_sync: tuple[tuple[int, int], ...] = ()

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickled through the constructor: vLLM sends it between processes, and the
        compiled build's frozen classes refuse the default pickle's attribute writes. The
        quiet plan goes by name, so that a worker in another process gets ``NOTHING``
        itself (its hooks tell it by identity)."""
        if self is NOTHING:
            return "NOTHING"
        return (StepPlan, (self.loads, self.stores, self.flush, self.promotes, self.demotions,
                           self.idle, self.sync, self.after_sync))


NOTHING = StepPlan()
"""The plan of a quiet step, in which the workers do nothing (shared: plans are frozen)."""


@dataclass
class JobReport:
    """A finished job as the workers saw it: ``ok`` only if every worker succeeded."""

    request_id: str
    direction: str
    ok: bool
