"""The scheduler half of the vLLM connector, in plain data (no vLLM import).

vLLM's scheduler calls the connector at fixed points of a step; each maps to one planner
call, and nothing here decides which chunks (that is ``kvtier.coverage``, via the planner):

====================================  ==================================================
vLLM                                  kvtier
====================================  ==================================================
``get_num_new_matched_tokens``        ``Planner.lookup``: hit, miss, or wait (None)
``update_state_after_alloc``          ``Planner.accept_hit`` with the allocated blocks
``build_connector_meta``              ``Planner.on_computed`` for this step's tokens,
                                      ``Planner.fence`` for reallocated blocks, and
                                      ``decline_hit`` for hits vLLM did not allocate
``update_connector_output``           ``complete_load`` / ``complete_store`` once every
                                      worker reported a job
``request_finished``                  ``Planner.finish``
====================================  ==================================================

Why stores are planned in the step that computes their tokens: the worker runs them right
after that step's forward, before vLLM can free a sliding-window block they read (vLLM frees
at the next step's scheduling). A freed block that is reallocated is fenced: the worker
waits for the stores still reading it before anything writes it.

>>> from kvtier.layout import Group, Layout
>>> sched = ConnectorScheduler(Layout((Group("full", 4, 2, bytes_per_token=8),)), 8, 1)
>>> sched.add_request("a", list(range(20)))
>>> sched.lookup("a", 0)
(0, False)
>>> plan = sched.step([StepRequest("a", ([1, 2, 3, 4, 5],), True, 20, list(range(20)))])
>>> [(c.chunk, c.block_ids) for c in plan.stores[0].copies]
[(0, (1, 2)), (1, (3, 4))]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from kvtier import coverage
from kvtier.boundaries import BoundaryMode
from kvtier.integrations.vllm.steps import NOTHING, BlockIds, JobReport, StepPlan, StepRequest
from kvtier.integrations.vllm.tiers import TieredHost
from kvtier.integrations.vllm.tracked import TrackedJob, TrackedRequest
from kvtier.keys import ChunkKey, Namespace
from kvtier.layout import Layout
from kvtier.planner import Outcome, Planner, RequestLimits, TransferJob
from kvtier.store.admission import Admission
from kvtier.store.manager import ChunkStore
from kvtier.store.results import EventKind, StoreEvent

IDLE_WAIT_S = 0.05
"""Longest a step in which vLLM scheduled nothing waits for the lower tiers (a Redis probe
here, a promotion in the worker) instead of returning to vLLM's loop, which would step again
at once and hold the GIL the waiting thread needs after each read; bounded, so that a request
arriving meanwhile is scheduled soon."""


class ConnectorScheduler:
    """Per-step planning for vLLM over one ``Planner`` and a metadata-only ``ChunkStore``.

    ``num_slots`` must equal the slots of each worker's host slab; ``num_workers`` is how
    many workers must report a job before it counts as done. ``tiers``: the lower tiers the
    workers hold (a ``TieredHost`` over this store), if any. ``clock`` is the planner's
    (the lookup deadline). ``admission``: when a new chunk is stored (``admit_after``).
    ``changes`` grows with every call that may move the planner's metrics or the store's
    events (not with a step that plans nothing): the connector's stats read it.
    ``sync_loads``: hits are loaded in the step that computes their requests (vLLM's
    synchronous load; ``StepPlan.sync``), not in a step of their own.
    """

    def __init__(
        self, layout: Layout, num_slots: int, num_workers: int, *, policy: str = "lru",
        namespace: Namespace | None = None, store: str = "all", wait_timeout_s: float = 0.05,
        boundaries: BoundaryMode = "dense", prune_chunked_local: bool = False,
        tiers: Callable[[ChunkStore], TieredHost] | None = None,
        clock: Callable[[], float] = time.monotonic, admission: Admission | None = None,
        sync_loads: bool = False,
    ) -> None:
        self.layout = layout
        self.store = ChunkStore(num_slots, policy=policy, admission=admission)
        self.tiers = None if tiers is None else tiers(self.store)
        self.planner = Planner(layout, self.tiers or self.store,
                               namespace or Namespace(layout.model),
                               wait_timeout_s=wait_timeout_s, clock=clock)
        self.num_workers = num_workers
        self._limits = RequestLimits(store="prompt" if store == "prompt" else "all",
                                     boundaries=boundaries,
                                     prune_chunked_local=prune_chunked_local)
        self._requests: dict[str, TrackedRequest] = {}
        self._jobs: dict[int, TrackedJob] = {}
        self._loads: list[TransferJob] = []
        self.sync_loads = sync_loads
        self._fresh: set[int] = set()
        self._unaccepted: set[str] = set()
        self._ready: set[ChunkKey] = set()
        self.events: list[StoreEvent] = []
        self.changes = 0
        self.store.subscribe(self._on_event)
        # A group that stores whole chunks keeps every block until the request ends: only
        # the other groups' tables can hold blocks vLLM handed to another request.
        self._windowed = [gi for gi, g in enumerate(layout.groups)
                          if not coverage.stores_whole_chunks(g)]
        self._state = {gi for gi, g in enumerate(layout.groups) if g.kind == "state"}

    # ---- requests ----------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: Sequence[int], salt: str | None = None) -> None:
        """A new request: its prompt is hashed once, here."""
        self.changes += 1
        self.planner.add_request(request_id, prompt, salt=salt, limits=self._limits)
        empty: list[list[int | None]] = [[] for _ in self.layout.groups]
        self._requests[request_id] = TrackedRequest(empty, len(prompt), len(prompt))
        self._requests[request_id].restart_stores(len(self.layout.groups))

    def lookup(self, request_id: str, num_computed: int, tokens: Sequence[int] = ()
               ) -> tuple[int | None, bool]:
        """vLLM's ``(num_external_tokens, load_async)``; ``None`` asks vLLM to wait.

        ``tokens``: every token the request knows. A preempted request resumes with its
        output too, and the lookup considers every one of them (``store: all`` stored their
        chunks). A hit is the planner's: for a prompt that ends on a boundary, its
        whole-prompt hit restores all but the last token, which vLLM computes.
        """
        self.changes += 1
        self._learn(request_id, tokens)
        if self.tiers is None:
            found = self.planner.lookup(request_id, num_computed)
        else:
            self.tiers.request = request_id  # what its lookups find below: one promotion a tier
            try:
                found = self.planner.lookup(request_id, num_computed)
            finally:
                self.tiers.request = None
        if found.outcome is Outcome.WAIT:
            return None, False
        if found.outcome is Outcome.MISS:
            return 0, False
        self._unaccepted.add(request_id)
        return found.hit_tokens - num_computed, not self.sync_loads

    def after_alloc(
        self, request_id: str, block_ids: Sequence[BlockIds], num_external: int
    ) -> None:
        """vLLM allocated blocks; for a hit, plan its load into them.

        Without a hit vLLM schedules the request in this step, and ``step`` sees its
        blocks; with one it may not (the load runs first), so they are marked fresh here.
        """
        if num_external == 0:
            return
        self.changes += 1
        for ids in block_ids:
            self._fresh.update(ids)
        self._unaccepted.discard(request_id)
        table = [_table_ids(ids) for ids in block_ids]
        job = self.planner.accept_hit(request_id, table)
        self._loads.append(job)
        if self.sync_loads:
            self._requests[request_id].sync_load = job.id
        self._jobs[job.id] = TrackedJob(job, self.num_workers)

    def finish(self, request_id: str) -> None:
        """The request finished or was aborted; its stores in flight stay fenced."""
        if self._requests.pop(request_id, None) is not None:
            self.changes += 1
            self._unaccepted.discard(request_id)
            self.planner.finish(request_id)

    def preempt(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is not None:
            self.changes += 1
            self.planner.preempt(request_id)
            req.tables = [[] for _ in self.layout.groups]
            req.restart_stores(len(self.layout.groups))
            req.stored_all = False  # its recomputed prompt is planned again

    # ---- steps -------------------------------------------------------------------------

    def step(
        self, requests: Iterable[StepRequest], reallocated: Iterable[int] = ()
    ) -> StepPlan:
        """Plan one step: ``requests`` scheduled in it, ``reallocated`` other block ids
        vLLM (re)wrote this step (e.g. copy destinations)."""
        steps = list(requests)
        fresh = self._fresh
        fresh.update(reallocated)
        for s in steps:
            for ids in s.block_ids or ():
                fresh.update(ids)
        fresh.discard(0)  # vLLM's null block
        self._forget_reallocated()  # before this step's blocks join the tables
        known = self._requests  # one that can store nothing more needs no table
        storing = [s for s in steps if not known[s.request_id].stored_all]
        for s in storing:
            self._update_table(s)
        # Fence before planning this step's stores: those run after the forward, and read
        # the blocks this step writes.
        flush = self._fences(fresh)
        stores = [job for s in storing if (job := self._store(s)) is not None]
        # stores of KV computed over a synchronous load not yet confirmed: the workers drop
        # them if it failed (that KV was computed on blocks the load did not write)
        after_sync = tuple((job.id, load) for job in stores
                           if (load := known[job.request_id].sync_load) is not None)
        for request_id in self._unaccepted:
            self.planner.decline_hit(request_id)
        if not steps and self.tiers is not None:
            self.tiers.settle(IDLE_WAIT_S)  # the next lookup folds the probes in
        below = self.tiers.take_plan(stores) if self.tiers is not None else ((), ())
        if self._unaccepted or not steps or self.tiers is not None:
            self.changes += 1
        plan = StepPlan(tuple(self._loads), tuple(stores), tuple(flush), *below,
                        idle=not steps, after_sync=after_sync,
                        sync=tuple(j.id for j in self._loads) if self.sync_loads else ())
        self._loads, self._fresh, self._unaccepted = [], set(), set()
        return plan

    def quiet(self, horizons: Sequence[tuple[str, int]]) -> StepPlan | None:
        """``step``'s plan, the shared empty one, for a step that only continues running
        requests with no new block (``(request id, horizon)`` each), if none passes anything
        it could store and none frees a window's block (most decoding steps: each request's
        horizon is below its ``due_at``); else None: ``step`` must plan it. Without
        ``step``'s bookkeeping: a request's last planned horizon stays, so the next planned
        step sees the same boundaries passed."""
        if (not horizons or self._loads or self._fresh or self._unaccepted or self._state
                or self.tiers is not None):
            return None
        known = self._requests
        for request_id, horizon in horizons:
            req = known.get(request_id)
            if req is None or (horizon >= req.due_at and not req.stored_all):
                return None
        return NOTHING

    def _fences(self, fresh: set[int]) -> list[int]:
        """Store jobs still reading any of the ``fresh`` blocks, in id order."""
        if not fresh or all(e.job.direction == "load" for e in self._jobs.values()):
            return []
        return sorted({j for g in range(len(self.layout.groups))
                       for j in self.planner.fence(g, fresh)})

    def _update_table(self, s: StepRequest) -> None:
        req = self._requests[s.request_id]
        for gi in self._state:  # one entry per block the horizon fills, None until named
            table = req.tables[gi]
            need = -(-s.horizon // self.layout.groups[gi].tokens_per_block)
            table.extend([None] * (need - len(table)))
        for gi, pos, block_id in s.state_blocks:
            table = req.tables[gi]
            table.extend([None] * (pos + 1 - len(table)))
            table[pos] = block_id
        if s.block_ids is None:
            return
        for gi, ids in enumerate(s.block_ids):
            if gi in self._state:
                continue  # vLLM's positions are not boundaries there: state_blocks are
            new = _table_ids(ids)
            if s.full_table:
                req.tables[gi] = new
            else:
                req.tables[gi].extend(new)

    def _forget_reallocated(self) -> None:
        """Blocks vLLM freed and handed out again no longer hold a request's KV. Only the
        blocks a later store may still read are checked: from ``live_from`` on (those
        before were freed, and are forgotten before any store: ``TrackedRequest.advance``)."""
        fresh = self._fresh
        if not fresh or not self._windowed:
            return
        for req in self._requests.values():
            if req.stored_all:
                continue
            for gi in self._windowed:
                table, start = req.tables[gi], req.live_from[gi]
                if fresh.isdisjoint(table[start:]):  # the usual case, at C speed
                    continue
                for i in range(start, len(table)):
                    if table[i] in fresh:
                        table[i] = None

    def _store(self, s: StepRequest) -> TransferJob | None:
        req = self._requests[s.request_id]
        if s.horizon <= req.prior_horizon:  # before len(): vLLM's token list is slow at it
            return None
        horizon = min(s.horizon, len(s.tokens))
        if horizon <= req.prior_horizon:
            return None
        due = self._due(req, horizon)
        req.advance(self.layout, self._windowed, horizon)
        if not due:
            req.due_at = req.next_due(self.layout, self._windowed)
            return None  # no boundary passed (most decoding steps): nothing became storable
        self.changes += 1
        req.num_boundaries = len(coverage.admissible_boundaries(self.layout, horizon))
        self._learn(s.request_id, s.tokens)  # hashed only when they may be stored
        metrics = self.planner.metrics
        refusals = metrics.store_refusals
        job = self.planner.on_computed(s.request_id, horizon, req.tables)
        req.retry = metrics.store_refusals > refusals
        req.due_at = req.next_due(self.layout, self._windowed)
        if (self._limits.store == "prompt" and horizon >= req.num_prompt and not req.retry
                and req.sync_load is None):
            req.stored_all, req.tables = True, [[] for _ in req.tables]
        if job is not None:
            self._jobs[job.id] = TrackedJob(job, self.num_workers)
        return job

    def _due(self, req: TrackedRequest, horizon: int) -> bool:
        """Whether store planning has work at ``horizon`` (past the last planned one): a
        refused store to retry, the prompt's end or a boundary passed since."""
        return (req.retry or req.prior_horizon < req.num_prompt <= horizon
                or len(coverage.admissible_boundaries(self.layout, horizon)) != req.num_boundaries)

    def _learn(self, request_id: str, tokens: Sequence[int]) -> None:
        """Hand the planner the tokens of ``tokens`` it has not seen yet."""
        req = self._requests[request_id]
        if len(tokens) > req.num_tokens:
            self.planner.append_tokens(request_id, tokens[req.num_tokens :])
            req.num_tokens = len(tokens)

    # ---- worker reports ----------------------------------------------------------------

    def on_reports(self, done: dict[int, tuple[int, bool]]) -> list[JobReport]:
        """Fold in ``{job_id: (workers_reporting, all_ok)}`` from one step's outputs;
        returns the jobs every worker has now finished."""
        if done:
            self.changes += 1
        finished = []
        for job_id, (count, ok) in done.items():
            if self.tiers is not None and self.tiers.owns(job_id):
                self.tiers.on_report(job_id, count, ok)
                continue
            entry = self._jobs.get(job_id)
            if entry is None:
                continue  # cancelled by reset
            entry.pending_workers -= count
            entry.ok = entry.ok and ok
            if entry.pending_workers <= 0:
                finished.append(self._complete(self._jobs.pop(job_id)))
        return finished

    def _complete(self, entry: TrackedJob) -> JobReport:
        job = entry.job
        if job.direction == "load":
            # A failed load drops its chunks: the retry recomputes instead of failing again.
            bad = () if entry.ok else [c.key for c in job.copies]
            self.planner.complete_load(job.id, entry.ok, bad)
            req = self._requests.get(job.request_id)
            if req is not None and req.sync_load == job.id:
                req.sync_load = None
                if not entry.ok:  # vLLM computes the request again in the blocks it holds
                    self.planner.preempt(job.request_id)  # its stores are planned again
                    req.restart_stores(len(self.layout.groups))
        else:
            self.planner.complete_store(job.id, entry.ok)
            if not entry.ok and self.tiers is not None:
                self.tiers.forget(c.key for c in job.copies)
        return JobReport(job.request_id, job.direction, entry.ok)

    # ---- cache-wide --------------------------------------------------------------------

    def _on_event(self, event: StoreEvent) -> None:
        self.changes += 1
        self.events.append(event)
        if event.kind is EventKind.STORED:
            self._ready.add(event.key)
        else:
            self._ready.discard(event.key)

    def take_events(self) -> list[StoreEvent]:
        events, self.events = self.events, []
        return events

    def close(self) -> None:
        """Stop the lower tiers' probes (nothing to do without lower tiers)."""
        if self.tiers is not None:
            self.tiers.close()

    def clear_cache(self) -> int:
        """Drop every stored chunk no load is reading; returns how many were dropped."""
        self.changes += 1
        return len(self.store.remove(list(self._ready)))


def _table_ids(ids: BlockIds) -> list[int | None]:
    """vLLM's block ids as a planner block-table row: vLLM's null block 0 becomes None."""
    return list(map(_NULL_TO_NONE.get, ids, ids))


_NULL_TO_NONE: dict[int, None] = {0: None}
