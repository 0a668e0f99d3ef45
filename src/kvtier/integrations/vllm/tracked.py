"""What the scheduler half of the vLLM connector (``scheduler``) keeps between steps: each
request's store planning and block tables, and each job until every worker reported it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtier.layout import Layout
from kvtier.planner import TransferJob
from kvtier.retention import admissible_grows_at, first_kept_block, retained_moves_at


@dataclass
class TrackedRequest:
    """``num_tokens``: tokens handed to the planner (``append_tokens``); ``prior_horizon``:
    the last horizon store planning saw; ``num_boundaries``: admissible boundaries at the
    last horizon handed to ``Planner.on_computed``; ``retry``: that call had a store
    refused, so call it again next step; ``live_from``: per group,
    ``retention.first_kept_block(group, prior_horizon)``: vLLM freed the blocks before it
    (``advance`` forgets them, so no store reads them), and only from it on can a block in
    the table be handed to another request (``ConnectorScheduler._forget_reallocated``);
    ``freed_to``: per group, how far ``advance`` forgot; ``stored_all``: ``store:
    prompt`` and the whole prompt planned, none refused: no store comes until a preemption,
    so no table is kept (``ConnectorScheduler.step``); ``sync_load``: the id of a synchronous
    load into its blocks not yet confirmed (if it fails, vLLM computes those blocks again,
    the stores planned meanwhile are dropped and planned again: ``StepPlan.after_sync``);
    ``due_at``: ``next_due`` as of the last planned step (0: at once), so that a quiet step
    compares one number per request (``ConnectorScheduler.quiet``)."""

    tables: list[list[int | None]]
    num_prompt: int
    num_tokens: int = 0
    prior_horizon: int = 0
    num_boundaries: int = 0
    retry: bool = False
    live_from: list[int] = field(default_factory=list)
    freed_to: list[int] = field(default_factory=list)
    stored_all: bool = False
    sync_load: int | None = None
    due_at: int = 0

    def restart_stores(self, num_groups: int) -> None:
        """Its KV is computed again from the start: every store is planned again."""
        self.prior_horizon, self.num_boundaries, self.due_at = 0, 0, 0
        self.live_from, self.freed_to = [0] * num_groups, [0] * num_groups

    def advance(self, layout: Layout, windowed: Sequence[int], horizon: int) -> None:
        """Store planning has seen ``horizon``. First the table entries before
        ``live_from`` are forgotten (vLLM freed those blocks as it scheduled this step, or
        earlier; a store planned now would read them after another request's forward may
        have written them): from here on no store reads them, whatever it serves. A state
        group's blocks are those vLLM names (``state_blocks``): kept."""
        for gi in windowed:
            group = layout.groups[gi]
            table, lo = self.tables[gi], self.freed_to[gi]
            hi = min(self.live_from[gi], len(table))
            if hi > lo and group.kind != "state":
                table[lo:hi] = [None] * (hi - lo)
                self.freed_to[gi] = hi
            self.live_from[gi] = first_kept_block(group, horizon)
        self.prior_horizon = horizon

    def next_due(self, layout: Layout, windowed: Sequence[int]) -> int:
        """The first horizon past ``prior_horizon`` at which a step has work for this
        request: store planning (``ConnectorScheduler._due``: at once for a refused store,
        else the prompt's end or the next admissible boundary, the ones admissible at
        ``prior_horizon`` being the ``num_boundaries`` planned), or ``advance`` (a window
        frees a block)."""
        if self.retry:
            return self.prior_horizon + 1
        at = admissible_grows_at(layout, self.num_boundaries)
        if self.prior_horizon < self.num_prompt:
            at = min(at, self.num_prompt)
        for gi in windowed:
            at = min(at, retained_moves_at(layout.groups[gi], self.prior_horizon))
        return at


@dataclass
class TrackedJob:
    """A job until every worker reported it."""

    job: TransferJob
    pending_workers: int
    ok: bool = True
