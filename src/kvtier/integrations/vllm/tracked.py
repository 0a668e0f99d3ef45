"""What the scheduler half of the vLLM connector (``scheduler``) keeps between steps: each
request's store planning and block tables, and each job until every worker reported it."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.planner import TransferJob


@dataclass
class TrackedRequest:
    """``num_tokens``: tokens handed to the planner (``append_tokens``); ``prior_horizon``:
    the last horizon store planning saw; ``num_boundaries``: admissible boundaries at the
    last horizon handed to ``Planner.on_computed``; ``retry``: that call had a store
    refused, so call it again next step; ``live_from``: per group,
    ``coverage.retained_blocks(group, prior_horizon).start``, before which a later store
    reads no block (``ConnectorScheduler._forget_reallocated``); ``stored_all``: ``store:
    prompt`` and the whole prompt planned, none refused: no store comes until a preemption,
    so no table is kept (``ConnectorScheduler.step``); ``sync_load``: the id of a synchronous
    load into its blocks not yet confirmed (if it fails, vLLM computes those blocks again,
    the stores planned meanwhile are dropped and planned again: ``StepPlan.after_sync``)."""

    tables: list[list[int | None]]
    num_prompt: int
    num_tokens: int = 0
    prior_horizon: int = 0
    num_boundaries: int = 0
    retry: bool = False
    live_from: list[int] = field(default_factory=list)
    stored_all: bool = False
    sync_load: int | None = None

    def restart_stores(self, num_groups: int) -> None:
        """Its KV is computed again from the start: every store is planned again."""
        self.prior_horizon, self.num_boundaries = 0, 0
        self.live_from = [0] * num_groups


@dataclass
class TrackedJob:
    """A job until every worker reported it."""

    job: TransferJob
    pending_workers: int
    ok: bool = True
