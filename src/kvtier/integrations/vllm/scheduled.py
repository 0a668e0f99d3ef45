"""The requests of one vLLM step, read from its ``SchedulerOutput`` (duck-typed: no vLLM
import), as the ``StepRequest`` list ``ConnectorScheduler.step`` plans from.

It runs once a step for every scheduled request, right after vLLM's forward pass has
pushed the connector's code and data out of the CPU's caches. The serving build leaves it
interpreted: in the engine, compiled, a quiet step's reading took 10.6 us, interpreted
4.7 (the interpreter's loop stays warm; the compiled function's code is fetched again).

>>> from types import SimpleNamespace as NS
>>> from kvtier.layout import Group, Layout
>>> layout = Layout((Group("full", 4, 2, bytes_per_token=8),))
>>> out = NS(scheduled_new_reqs=[NS(req_id="a", block_ids=([1, 2],))],
...          scheduled_cached_reqs=NS(req_ids=["b"], new_block_ids=[None],
...                                   resumed_req_ids=set()),
...          num_scheduled_tokens={"a": 8, "b": 1}, scheduled_spec_decode_tokens={})
>>> requests = {"a": NS(num_computed_tokens=0, all_token_ids=list(range(8))),
...             "b": NS(num_computed_tokens=12, all_token_ids=list(range(13)))}
>>> [(s.request_id, s.block_ids, s.full_table, s.horizon)
...  for s in scheduled_steps(out, requests, layout)]
[('a', ([1, 2],), True, 8), ('b', None, False, 13)]
"""

from __future__ import annotations

from typing import Any

from kvtier.integrations.vllm.state import state_blocks
from kvtier.integrations.vllm.steps import StepRequest
from kvtier.layout import Layout


def scheduled_steps(out: Any, requests: dict[str, Any], layout: Layout) -> list[StepRequest]:
    """Each scheduled request's part of the step: new requests (and resumed ones) with
    their whole block table, the others with the blocks added this step. ``requests``:
    vLLM's ``Request`` objects by id."""
    offloads = offloads_of(out)
    drafts: dict[str, Any] = out.scheduled_spec_decode_tokens or {}
    num_scheduled: dict[str, int] = out.num_scheduled_tokens
    steps: list[StepRequest] = []
    for new in out.scheduled_new_reqs:
        req_id: str = new.req_id
        steps.append(_step(req_id, new.block_ids, True, requests[req_id],
                           num_scheduled[req_id], drafts, offloads, layout))
    cached = out.scheduled_cached_reqs
    resumed = cached.resumed_req_ids
    for req_id, ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
        steps.append(_step(req_id, ids, req_id in resumed, requests[req_id],
                           num_scheduled[req_id], drafts, offloads, layout))
    return steps


def _step(req_id: str, block_ids: Any, full: bool, request: Any, num_scheduled: int,
          drafts: dict[str, Any], offloads: dict[str, list[tuple[int, int, int]]],
          layout: Layout) -> StepRequest:
    found = offloads.get(req_id) if offloads else None
    return StepRequest(req_id, block_ids, full, _horizon(req_id, request, num_scheduled, drafts),
                       request.all_token_ids, state_blocks(layout, found) if found else ())


def _horizon(req_id: str, request: Any, num_scheduled: int, drafts: dict[str, Any]) -> int:
    """Tokens with KV once the step's forward ran: its draft tokens left out (the
    verification may reject them)."""
    horizon: int = request.num_computed_tokens + num_scheduled
    if drafts:
        horizon -= len(drafts.get(req_id, ()))
    return horizon


def continuing_horizons(out: Any) -> list[tuple[str, int]] | None:
    """``(request id, horizon)`` of each request a step continues, when that is all it
    does: no new, resumed or preempted request, no new block, no block copy, no state
    hand-off (most decoding steps); else None (``ConnectorScheduler.quiet``). Read from
    the output alone (``num_computed_tokens`` as vLLM scheduled the step), not from the
    requests: it runs every step, on data the forward has pushed out of the caches."""
    block_state = getattr(out, "kv_connector_block_state", None)  # (None: no exception)
    if (out.scheduled_new_reqs or out.preempted_req_ids or out.kv_cache_block_copies
            or (block_state is not None
                and getattr(block_state, "boundary_state_offloads", None))):
        return None
    cached = out.scheduled_cached_reqs
    if cached.resumed_req_ids:
        return None
    for ids in cached.new_block_ids:
        if ids is not None and any(ids):
            return None
    drafts: dict[str, Any] = out.scheduled_spec_decode_tokens or {}
    num_scheduled: dict[str, int] = out.num_scheduled_tokens
    computed: list[int] = cached.num_computed_tokens
    horizons: list[tuple[str, int]] = []
    for i, req_id in enumerate(cached.req_ids):
        horizon = computed[i] + num_scheduled[req_id]
        if drafts:
            horizon -= len(drafts.get(req_id, ()))
        horizons.append((req_id, horizon))
    return horizons


def offloads_of(out: Any) -> dict[str, list[tuple[int, int, int]]]:
    """``boundary_state_offloads`` of a vLLM ``SchedulerOutput`` ({} where the build has no
    ``kv_connector_block_state``, or the step offers none;
    ``kvtier.integrations.vllm.state`` says what they are)."""
    block_state = getattr(out, "kv_connector_block_state", None)
    return dict(getattr(block_state, "boundary_state_offloads", None) or {})
