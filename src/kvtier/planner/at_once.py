"""A planner for callers that move no bytes: stores and loads complete within the call.

A simulation (``kvtier replay``) runs the planner's rules over a store of metadata: it has
no engine blocks and no data plane, and completes every job as soon as it is made. For it,
``store_at_once`` is ``on_computed`` followed by ``complete_store(ok=True)``, and
``load_at_once`` is ``accept_hit`` followed by ``complete_load(ok=True)``: the same
chunks planned by ``kvtier.coverage``, the same store calls in the same order, the same
counters, without the job, its per-chunk copies, the fences over engine blocks or the
block table they would need (tested equal to the two-step calls). Over a ``ChunkStore``
the store completes a store itself (``prepare_store(now=True)``).
"""

from __future__ import annotations

from typing import ClassVar

from kvtier.keys import ChunkKey
from kvtier.planner.binding import _subsequence
from kvtier.planner.planner import Planner
from kvtier.planner.requests import check_horizon
from kvtier.store.manager import ChunkStore
from kvtier.store.results import StoreRefusal


class AtOncePlanner(Planner):
    """``Planner`` plus stores and loads completed within the call (module docstring)."""

    READY_FIRST: ClassVar[bool] = True  # a replay's largest candidate is its block hit

    def store_at_once(self, request_id: str, horizon: int) -> list[tuple[int, int]]:
        """``on_computed(request_id, horizon, table)`` over a table holding every block,
        then ``complete_store(ok=True)`` of its job: the (group, chunk) of each chunk
        stored, in store order (a chunk the store already held, or did not admit, is not
        one; refused ones are retried on the next call, as ``on_computed``'s)."""
        with self._lock:
            req = self._request(request_id)
            check_horizon("store_at_once", req, horizon)
            self._plan_new_chunks(req, horizon)
            pending, req.pending = req.pending, []
            if not pending:
                return []
            keys, parents = self._binder.keys_and_parents(req, pending)
            store = self.store
            if type(store) is ChunkStore:  # completed by the store within the call
                handle = store.prepare_store(keys, parents, now=True)
            else:
                handle = store.prepare_store(keys, parents)
            if isinstance(handle, StoreRefusal):
                self._count(req, "store_refusals")
                if handle.retryable:
                    req.pending = pending
                return []
            if handle.declined:
                self._count(req, "chunks_not_admitted", len(handle.declined))
            if type(store) is not ChunkStore:
                store.complete_store(handle, True)
            if not handle.keys:
                return []
            stored = _stored(pending, keys, handle.keys)
            per = self._binder._chunk_bytes
            nbytes = sum([per[gi] for gi, _ in stored])
            for m in (self.metrics, req.metrics):
                m.add_stored(len(stored), nbytes)
            return stored

    def load_at_once(self, request_id: str) -> list[list[ChunkKey]]:
        """``accept_hit`` of the hit ``lookup`` pinned, then ``complete_load(ok=True)``:
        per group, the keys loaded (``PendingHit.keys``)."""
        with self._lock:
            req = self._request(request_id)
            hit = req.hit
            if hit is None or hit.job_id is not None:
                raise ValueError(f"request {request_id!r} has no hit waiting to be accepted")
            self.store.complete_load(hit.handle)
            req.hit = None
            tokens = hit.lookup.hit_tokens - hit.on_device
            per = self._binder._chunk_bytes
            chunks = sum([len(ks) for ks in hit.keys])
            nbytes = sum([per[gi] * len(ks) for gi, ks in enumerate(hit.keys)])
            for m in (self.metrics, req.metrics):
                m.add_loaded(self.tier_name, tokens, chunks, nbytes)
            self._maybe_forget(req)
            return hit.keys


def _stored(pending: list[tuple[int, int]], keys: list[ChunkKey],
            reserved: tuple[ChunkKey, ...]) -> list[tuple[int, int]]:
    """The entries of ``pending`` (``keys[i]`` is ``pending[i]``'s) whose keys the store
    reserved: all of them, or found in order as ``ChunkBinder.copies`` finds them."""
    if len(reserved) == len(keys):
        return pending
    tail = len(keys) - len(reserved)
    if tuple(keys[tail:]) == reserved:  # the usual case: the hit's chunks held, then new ones
        return pending[tail:]
    index = _subsequence(keys, reserved)
    if index is None:  # a store that reordered the keys: found by key
        where = {k: i for i, k in enumerate(keys)}
        index = [where[k] for k in reserved]
    return [pending[i] for i in index]
