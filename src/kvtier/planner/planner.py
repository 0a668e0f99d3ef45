"""The per-request lifecycle: lookup, load jobs, store jobs and fences.

An engine calls the planner from its scheduler:

1. ``add_request`` with the prompt's tokens (``append_tokens`` as decoding adds more);
2. ``lookup(request, on_device)`` -> ``Lookup``: a hit (its chunks are pinned at once, so
   nothing the hit counted can be evicted under it), a miss, or a wait;
3. ``accept_hit(request, block_table)`` once blocks are allocated -> a load ``TransferJob``
   (exactly ``coverage.load_set``), or ``decline_hit`` when the engine cannot take it;
4. ``on_computed(request, horizon, block_table)`` after every step -> a store
   ``TransferJob`` for exactly the new chunks of ``coverage.store_set``, or None;
5. ``fence(group, block_ids)`` before the engine reuses blocks: the store jobs still reading
   them, to wait for;
6. ``complete_load`` / ``complete_store`` from the data plane;
7. ``preempt``, ``abort``, ``finish`` and ``reset``.

Steps are separate because the engine interleaves them with its own allocation: blocks do
not exist at lookup time, and stores finish after the blocks' owner moved on. Every
decision about which chunks comes from ``kvtier.coverage``; this module orders the steps,
``binding`` binds chunks to keys, slots and block ids, and ``jobs`` keeps the jobs in
flight. A block table is a sequence per group (group outermost) of block ids indexed by
block position in the request; ``None`` or a negative id marks a block the engine does not
hold.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import ClassVar

from kvtier.keys import ChunkKey, KeyChain, Namespace
from kvtier.layout import Layout
from kvtier.planner import lookup
from kvtier.planner.binding import BlockTable, ChunkBinder
from kvtier.planner.jobs import JobBook
from kvtier.planner.requests import PendingHit, RequestState, check_computed, extended, prompt_chain
from kvtier.planner.serving import DenseChunks, ServedChunks, add_offered, new_chunks, shared_point
from kvtier.planner.types import LoadResult, Lookup, Metrics, Outcome, RequestLimits, TransferJob
from kvtier.store.manager import ChunkStore
from kvtier.store.protocol import StoreProtocol
from kvtier.store.results import ChunkNotReadyError, StoreRefusal


class Planner:
    """Engine-agnostic request planning over a store (a ``ChunkStore`` or ``TieredStore``).

    ``clock`` is injected (seconds, monotonic); ``wait_timeout_s`` bounds how long a lookup
    answers WAIT before taking the largest hit that is ready. One lock guards all state:
    the scheduler thread and transfer completions may call concurrently.
    """

    READY_FIRST: ClassVar[bool] = False  # over a ChunkStore too, ready_at before the walk

    def __init__(
        self,
        layout: Layout,
        store: StoreProtocol,
        namespace: Namespace,
        *,
        clock: Callable[[], float] = time.monotonic,
        wait_timeout_s: float = 0.05,
        tier_name: str = "host",
    ) -> None:
        if not 0 <= wait_timeout_s < math.inf:  # NaN compares false: refused too
            raise ValueError(f"wait_timeout_s must be a finite number >= 0 (seconds), got "
                             f"{wait_timeout_s}")
        self.layout, self.store, self.namespace = layout, store, namespace
        self.clock, self.wait_timeout_s, self.tier_name = clock, wait_timeout_s, tier_name
        self.metrics = Metrics()
        self._lock = threading.RLock()
        self._requests: dict[str, RequestState] = {}
        self._jobs = JobBook(len(layout.groups))
        self._binder = ChunkBinder(layout)
        self._load_ranges = lookup.LoadRanges(layout)
        self._dense = DenseChunks(layout)
        self._served = ServedChunks(layout)
        self._hits: dict[int, list[int]] = {}  # consumer hits per token count (requests')
        # a ChunkStore's lookup changes nothing: spans of KeyChain's keys (assess_at_once)
        self._states = store.lookup_checked if type(store) is ChunkStore else None

    # ---- requests ----------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt: Iterable[int] | KeyChain, *, salt: str | None = None,
        limits: RequestLimits | None = None,
    ) -> None:
        """Register a request by its prompt tokens, or by a ``KeyChain`` the caller built
        over them (``requests.prompt_chain``: not hashed again); ``salt`` isolates a tenant."""
        with self._lock:
            if request_id in self._requests:
                raise ValueError(f"request {request_id!r} is already registered")
            chain = prompt_chain(request_id, prompt, self.layout, self.namespace, salt)
            self._requests[request_id] = RequestState(
                request_id, chain, chain.num_tokens, limits or RequestLimits()
            )

    def append_tokens(self, request_id: str, tokens: Iterable[int] | KeyChain) -> None:
        """Tokens generated by decoding (so the answer can be stored too), or a chain that
        ``continues`` the request's (``requests.extended``: not hashed again)."""
        with self._lock:
            req = self._request(request_id)
            req.chain = extended(request_id, req.chain, tokens)

    def request_metrics(self, request_id: str) -> Metrics:
        with self._lock:
            return self._request(request_id).metrics

    def _request(self, request_id: str) -> RequestState:
        try:
            return self._requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}; call add_request first") from None

    def _count(self, req: RequestState | None, name: str, n: int = 1) -> None:
        """The one place counters change: the request's and the planner's totals."""
        for m in (self.metrics,) if req is None else (self.metrics, req.metrics):
            setattr(m, name, getattr(m, name) + n)

    # ---- lookup ------------------------------------------------------------------------

    def lookup(self, request_id: str, on_device: int = 0) -> Lookup:
        """Hit, miss or wait for ``request_id``, whose first ``on_device`` tokens the engine
        already holds. Every token known counts (``append_tokens`` a preempted request's
        output before it resumes), capped as ``coverage.consumer_hits`` says. A hit pins
        its chunks until ``accept_hit``'s load completes or ``decline_hit``; asking again
        before that returns the same hit."""
        with self._lock, self.store.lock:
            req = self._request(request_id)
            if req.hit is not None:
                return req.hit.lookup
            if req.limits.boundaries == "shared":
                req.shared_point = max(req.shared_point, shared_point(
                    self.layout, req.chain, req.num_prompt, on_device, self.store.lookup))
            result = self._decide(req, on_device)
            self._count_lookup(req, result)
            return result

    def _decide(self, req: RequestState, on_device: int) -> Lookup:
        # every token known may have stored KV: a resumed request's output too
        ranges, hits = self._load_ranges, req.consumer_hits(self.layout, self._hits)
        candidates = lookup.candidate_hits(self.layout, req.chain.num_tokens, on_device,
                                           req.limits.max_load_tokens, hits)
        if not candidates:
            return Lookup(Outcome.MISS, on_device)
        loading = self._jobs.loading()
        states = self.store.lookup if self._states is None else self._states
        if self._states is None or self.READY_FIRST:  # the largest candidate, then the walk
            whole = lookup.ready_at(self.layout, req.chain, candidates[0], on_device, states,
                                    loading, ranges)  # the largest hit, all ready: no more
            if whole is not None:
                return self._pin_hit(req, candidates[0], on_device, whole)
        if self._states is not None:
            avail = lookup.assess_at_once(self.layout, req.chain, candidates, on_device,
                                          self._states, loading, ranges)
        else:  # a store whose lookup promotes or probes: asked in the walk's order
            avail = lookup.assess(self.layout, req.chain, candidates, on_device,
                                  states, loading, ranges)
        best = avail.best_ready
        if avail.best_soon > best:
            now = self.clock()
            if req.wait_deadline is None:
                req.wait_deadline = now + self.wait_timeout_s
            if now < req.wait_deadline:
                return Lookup(Outcome.WAIT, on_device, wait_until=req.wait_deadline)
            if not req.expired:
                req.expired = True
                self._count(req, "deadline_expiries")
            best = avail.best_readable
        if best <= on_device:
            return Lookup(Outcome.MISS, on_device)
        return self._pin_hit(req, best, on_device, lookup.hit_keys(self.layout, req.chain,
                                                                   best, on_device, ranges))

    def _pin_hit(
        self, req: RequestState, b: int, on_device: int, keys: list[list[ChunkKey]]
    ) -> Lookup:
        """Pin ``keys`` (per group, the chunks a hit at ``b`` loads) and record the hit.

        A store whose ``lookup`` promotes from a lower tier at once (a ``TieredStore``
        over synchronous tiers: the metadata replay's) protects only the keys of that
        call, so a promotion for one group may have evicted a chunk another call found:
        the hit's chunks are then asked for together, and pinned if that brought them all
        back, else the lookup misses."""
        chunks = lookup.hit_chunks(self.layout, b, on_device, self._load_ranges)
        flat = [*itertools.chain.from_iterable(keys)]
        try:
            handle = self.store.prepare_load(flat)
        except ChunkNotReadyError:
            if not all(s.readable for s in self.store.lookup(flat)):
                return Lookup(Outcome.MISS, on_device)
            handle = self.store.prepare_load(flat)
        result = Lookup(Outcome.HIT, b, chunks)
        req.hit = PendingHit(result, on_device, keys, handle)
        return result

    def _count_lookup(self, req: RequestState, result: Lookup) -> None:
        o = result.outcome  # by identity: an enum's value and hash are Python calls
        name = "hit" if o is Outcome.HIT else "miss" if o is Outcome.MISS else o.value
        for m in (self.metrics, req.metrics):
            m.lookups[name] += 1
        if o is Outcome.WAIT:
            self._count(req, "waits")

    # ---- loads -------------------------------------------------------------------------

    def accept_hit(self, request_id: str, block_table: BlockTable) -> TransferJob:
        """The load job for the pinned hit, once the engine allocated its blocks."""
        with self._lock:
            req = self._request(request_id)
            hit = req.hit
            if hit is None or hit.job_id is not None:
                raise ValueError(f"request {request_id!r} has no hit waiting to be accepted")
            copies = self._binder.load_copies(hit, block_table, request_id)
            job = TransferJob(self._jobs.next_id(), request_id, "load", copies)
            hit.job_id = job.id
            self._jobs.add(job, hit.handle)  # complete_load counts the access
            return job

    def decline_hit(self, request_id: str) -> None:
        """The engine will not take the pinned hit (e.g. no free blocks): unpin it."""
        with self._lock:
            req = self._request(request_id)
            if req.hit is not None and req.hit.job_id is None:
                self.store.complete_load(req.hit.handle)
                req.hit = None

    def complete_load(
        self, job_id: int, ok: bool, corrupt: Iterable[ChunkKey] = ()
    ) -> LoadResult | None:
        """The data plane finished a load. On failure the hit rolls back: the engine
        recomputes from what it had before, and ``corrupt`` chunks are dropped from the
        store. None for a job cancelled by ``reset``."""
        with self._lock:
            entry = self._jobs.take(job_id, "load")
            if entry is None:
                return None
            job, handle = entry
            self.store.complete_load(handle)  # type: ignore[arg-type]
            req = self._requests[job.request_id]
            assert req.hit is not None and req.hit.job_id == job_id
            hit, req.hit = req.hit, None
            req.load_jobs.discard(job_id)
            result = self._load_outcome(req, job, hit, ok, corrupt)
            self._maybe_forget(req)
            return result

    def _load_outcome(
        self, req: RequestState, job: TransferJob, hit: PendingHit, ok: bool,
        corrupt: Iterable[ChunkKey],
    ) -> LoadResult:
        if not ok:
            self._count(req, "load_failures")
            self._count(req, "corrupt_chunks_dropped", len(self.store.remove(corrupt)))
            return LoadResult(req.request_id, False, hit.on_device)
        tokens = hit.lookup.hit_tokens - hit.on_device
        self._count(req, "hit_tokens", tokens)
        for m in (self.metrics, req.metrics):
            by_tier = m.hit_tokens_by_tier
            by_tier[self.tier_name] = by_tier.get(self.tier_name, 0) + tokens
        self._count(req, "chunks_loaded", len(job.copies))
        self._count(req, "bytes_loaded", self._binder.num_bytes(job.copies))
        return LoadResult(req.request_id, True, hit.lookup.hit_tokens)

    # ---- stores ------------------------------------------------------------------------

    def on_computed(
        self, request_id: str, horizon: int, block_table: BlockTable
    ) -> TransferJob | None:
        """The engine has computed ``horizon`` tokens of the request: the store job for the
        chunks that became storable (refused ones are retried on the next call)."""
        with self._lock:
            req = self._request(request_id)
            check_computed(self.layout.groups, req, horizon, block_table)
            self._plan_new_chunks(req, horizon)
            return self._store_pending(req, block_table)

    def _plan_new_chunks(self, req: RequestState, horizon: int) -> None:
        cap = req.store_cap(horizon)
        if cap <= req.stored_horizon:
            return
        chunks = new_chunks(self.layout, req, cap, self._dense, self._served)
        req.stored_horizon = cap
        if not chunks:  # most decoding steps
            return
        self._count(req, "chunks_offered", len(chunks))
        add_offered((self.metrics, req.metrics), chunks, len(self.layout.groups))
        req.pending.extend(chunks)

    def _store_pending(self, req: RequestState, block_table: BlockTable) -> TransferJob | None:
        live = self._binder.live(req.pending, block_table)
        req.pending = []
        if not live:
            return None
        keys, parents = self._binder.keys_and_parents(req, [(c.group, c.chunk) for c in live])
        handle = self.store.prepare_store(keys, parents)
        if isinstance(handle, StoreRefusal):
            self._count(req, "store_refusals")
            if handle.retryable:
                req.pending = [(c.group, c.chunk) for c in live]
            return None
        if handle.declined:  # not admitted (kvtier.store.admission): not stored, not retried
            self._count(req, "chunks_not_admitted", len(handle.declined))
        if not handle.keys:
            self.store.complete_store(handle, True)
            return None
        copies = self._binder.copies(handle, keys, live)
        job = TransferJob(self._jobs.next_id(), req.request_id, "store", copies)
        self._jobs.add(job, handle)
        req.store_jobs.add(job.id)
        return job

    def complete_store(self, job_id: int, ok: bool) -> None:
        """The data plane finished a store: publish its chunks, or free their slots."""
        with self._lock:
            entry = self._jobs.take(job_id, "store")
            if entry is None:
                return
            job, handle = entry
            self.store.complete_store(handle, ok)  # type: ignore[arg-type]
            req = self._requests[job.request_id]
            req.store_jobs.discard(job_id)
            if ok:
                self._count(req, "chunks_stored", len(job.copies))
                self._count(req, "bytes_stored", self._binder.num_bytes(job.copies))
            else:
                self._count(req, "store_failures")
            self._maybe_forget(req)

    def fence(self, group: int, block_ids: Iterable[int]) -> list[int]:
        """Store jobs still reading any of ``block_ids`` of ``group``: wait for them before
        the engine writes those blocks again."""
        with self._lock:
            return self._jobs.reading(group, block_ids)

    # ---- ends of a request -------------------------------------------------------------

    def preempt(self, request_id: str) -> None:
        """The engine frees the request's blocks and will recompute it later. In-flight
        stores stay fenced; unstored chunks are planned again when it runs again."""
        with self._lock:
            req = self._request(request_id)
            self.decline_hit(request_id)
            req.pending, req.stored_horizon, req.served = [], 0, []
            req.wait_deadline, req.expired = None, False

    def abort(self, request_id: str) -> None:
        """Drop the request. Loads and stores in flight complete normally (the engine waits
        for loads before freeing their blocks); the record goes once they have."""
        self._close(request_id)

    def finish(self, request_id: str) -> None:
        """The request finished: like ``abort`` after a last ``on_computed``."""
        self._close(request_id)

    def _close(self, request_id: str) -> None:
        with self._lock:
            req = self._request(request_id)
            if req.hit is not None:  # most requests end with none pinned
                self.decline_hit(request_id)
            req.pending, req.closed = [], True
            self._maybe_forget(req)

    def _maybe_forget(self, req: RequestState) -> None:
        if req.closed and req.idle:
            del self._requests[req.request_id]

    def reset(self) -> None:
        """Forget every request; jobs in flight are cancelled (stores freed, loads
        unpinned). The engine must have stopped its transfers; their late completions are
        ignored."""
        with self._lock:
            for job, handle in self._jobs.cancel_all():
                if job.direction == "load":
                    self.store.complete_load(handle)  # type: ignore[arg-type]
                else:
                    self.store.complete_store(handle, False)  # type: ignore[arg-type]
            for req in self._requests.values():
                if req.hit is not None and req.hit.job_id is None:
                    self.store.complete_load(req.hit.handle)
            self._requests.clear()

    # ---- introspection -----------------------------------------------------------------

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    @property
    def jobs_in_flight(self) -> int:
        return len(self._jobs)

    def check_quiescent(self) -> None:
        """Assert nothing is left: no requests, jobs, fences or in-flight loads."""
        with self._lock:
            self._jobs.check_quiescent()
            assert not self._requests, f"requests left: {list(self._requests)}"
