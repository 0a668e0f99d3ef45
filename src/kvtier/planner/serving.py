"""Store planning over the boundaries a request serves (``kvtier.boundaries``).

``new_chunks`` is what ``Planner.on_computed`` plans after each step: in ``dense`` mode
``coverage.store_delta`` of every group (the request serves every admissible boundary); in
the other modes the groups ``boundaries.prunable`` keeps (full attention, whose store sets
are prefixes, and chunked local unless pruned on request) still follow ``store_delta``,
and the others ``coverage.serve_delta`` over the boundaries the request starts serving.
``shared_point`` is read at lookup, from the same store the lookup reads.

Example (tests/planner/test_boundaries_scenarios.py): full + sliding window 16 in 16-token
chunks; producer A (100 tokens) serves 96 and stores sliding chunk 5 only; B shares A's
first 64 tokens and serves 64 and 80 (sliding chunks 3 and 4); C, sharing the same 64
tokens, hits at 64.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtier import boundaries, coverage
from kvtier.keys import ChunkKey, KeyChain
from kvtier.layout import Layout
from kvtier.planner.requests import RequestState
from kvtier.planner.types import Metrics
from kvtier.store.results import ChunkState


def add_offered(totals: tuple[Metrics, ...], chunks: list[tuple[int, int]],
                num_groups: int) -> None:
    """Count ``chunks`` (group, chunk) in each of ``totals``' ``chunks_offered_by_group``
    (a plain loop: Counter's counting is interpreted; one group's are all of them)."""
    counts: dict[int, int] = {}
    if num_groups == 1:
        counts[0] = len(chunks)
    else:
        for gi, _ in chunks:
            counts[gi] = counts.get(gi, 0) + 1
    for m in totals:
        for gi, n in counts.items():
            m.chunks_offered_by_group[gi] = m.chunks_offered_by_group.get(gi, 0) + n


def new_chunks(layout: Layout, req: RequestState, cap: int, dense: DenseChunks,
               served: ServedChunks) -> list[tuple[int, int]]:
    """(group, chunk) pairs that become storable as the capped horizon reaches ``cap``;
    records the boundaries the request now serves. ``dense`` and ``served``: the planner's
    tables of ``coverage.store_delta`` and ``coverage.serve_delta`` as pairs."""
    mode = req.limits.boundaries
    old_n = len(coverage.admissible_boundaries(layout, req.stored_horizon))
    new_n = len(coverage.admissible_boundaries(layout, cap))
    passed = new_n > old_n
    if mode == "dense":  # store_delta of every group: the same for every request
        return dense.between(old_n, new_n) if passed else []
    prompt_end = req.store_cap(req.num_prompt)
    if not passed and not req.stored_horizon < prompt_end <= cap:
        return []  # no boundary nor the prompt's end passed (most decoding steps)
    last = req.served[-1] if req.served else 0
    fresh = boundaries.newly_served(layout, mode, last, cap, prompt_end=prompt_end,
                                    num_prompt=req.num_prompt, shared=req.shared_point)
    out: list[tuple[int, int]] = []
    for gi, group in enumerate(layout.groups):
        if not boundaries.prunable(group, prune_chunked_local=req.limits.prune_chunked_local):
            out += dense.of_group(gi, old_n, new_n)  # store_delta(stored_horizon, cap)
        else:
            out += served.delta(gi, req.served, fresh)
    req.served.extend(fresh)
    return out


class DenseChunks:
    """A dense producer's new chunks by admissible boundaries passed, for one layout.

    The chunks serving each single boundary adds (``coverage.dense_delta`` from ``k`` to
    ``k + 1`` boundaries), kept per group in a list indexed by boundary count: a step from
    ``old`` to ``new`` boundaries joins those of ``old .. new - 1``, whatever steps earlier
    requests took, with no per-chunk work but copying pairs. The same chunks in the same
    order as ``dense_delta(old, new)`` (group outermost, ascending): store sets only grow,
    and since both ends of ``required`` never decrease as the boundary grows, each
    boundary's new chunks lie past the previous one's. Boundaries not seen yet are asked
    for together (one ``dense_delta``) and each chunk is filed under the boundary that adds
    it, its ``coverage.first_boundary``; where that does not come out ascending within the
    range, boundary by boundary.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._added: list[list[tuple[tuple[int, int], ...]]] = [[] for _ in layout.groups]

    def between(self, old: int, new: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for gi, added in enumerate(self._added):
            if len(added) < new:
                self._fill(gi, added, new)
            for k in range(old, new):
                out.extend(added[k])
        return out

    def of_group(self, gi: int, old: int, new: int) -> list[tuple[int, int]]:
        """``between`` of group ``gi`` alone: ``coverage.dense_delta(layout, gi, old, new)``
        as pairs (``store_delta`` of any two horizons with ``old`` and ``new`` boundaries)."""
        added = self._added[gi]
        if len(added) < new:
            self._fill(gi, added, new)
        if new - old == 1:
            return list(added[old])
        out: list[tuple[int, int]] = []
        for k in range(old, new):
            out += added[k]
        return out

    def _fill(self, gi: int, added: list[tuple[tuple[int, int], ...]], new: int) -> None:
        layout, start = self.layout, len(added)
        g = layout.hit_granularity
        per: list[list[tuple[int, int]]] = [[] for _ in range(new - start)]
        last = 0
        for c in coverage.dense_delta(layout, gi, start, new):
            k = coverage.first_boundary(layout, gi, c) // g - 1 - start
            if not last <= k < len(per):  # not ascending in range: boundary by boundary
                for k in range(start, new):
                    delta = coverage.dense_delta(layout, gi, k, k + 1)
                    added.append(tuple((gi, c) for c in delta))
                return
            per[k].append((gi, c))
            last = k
        added.extend(tuple(p) for p in per)


class ServedChunks:
    """``coverage.serve_delta`` as (group, chunk) pairs, remembered for short served lists:
    producers of prompts ending at the same boundary serve the same boundaries and add the
    same chunks (``end`` and ``shared``, at the prompt's end), so most answers repeat.
    Bounded: forgotten all at once when full; lists of served boundaries longer than
    ``SHORT`` (a long answer's ends) are not remembered."""

    LIMIT = 1 << 14
    SHORT = 8

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._known: dict[tuple[int, tuple[int, ...], tuple[int, ...]],
                          tuple[tuple[int, int], ...]] = {}

    def delta(self, gi: int, served: list[int], new: list[int]) -> tuple[tuple[int, int], ...]:
        """``serve_delta(layout, gi, served, new)`` as pairs, in chunk order."""
        if len(served) > self.SHORT:
            return self._pairs(gi, served, new)
        key = (gi, tuple(served), tuple(new))
        found = self._known.get(key)
        if found is None:
            found = self._pairs(gi, served, new)
            if len(self._known) >= self.LIMIT:
                self._known.clear()
            self._known[key] = found
        return found

    def _pairs(self, gi: int, served: list[int], new: list[int]) -> tuple[tuple[int, int], ...]:
        return tuple((gi, c) for c in coverage.serve_delta(self.layout, gi, served, new))


def shared_point(
    layout: Layout, chain: KeyChain, num_prompt: int, on_device: int,
    states: Callable[[list[ChunkKey]], list[ChunkState]],
) -> int:
    """``boundaries.shared_point`` of the request: its full-attention chunks count as
    present when in the store (readable or being written) or wholly on the device."""
    bounds = coverage.admissible_boundaries(layout, num_prompt, num_prompt)
    top = bounds[-1] if bounds else 0
    present = []
    for gi, group in enumerate(layout.groups):
        if not coverage.needs_predecessor(group) or not top:
            present.append(0)
            continue
        wanted = coverage.load_chunks(group, top, on_device)
        found = states(chain.keys(gi, wanted)) if wanted else []
        gap = next((i for i, st in enumerate(found)
                    if not (st.readable or st is ChunkState.WRITING)), len(found))
        present.append(wanted.start + gap)
    return boundaries.shared_point(layout, num_prompt, present)
