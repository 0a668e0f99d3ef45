"""Which admissible boundaries a producer serves (DESIGN section 3).

A producer stores ``coverage.store_set`` over the boundaries it serves. Serving every
admissible boundary (``dense``) lets a consumer hit at any of them, but a sliding-window
group then stores nearly every chunk. Serving fewer stores far fewer partial-window chunks,
at the price of hits in the middle of a prefix. A lookup never assumes which boundaries a
producer served: it tries candidates from the largest down.

Modes, for a request with prompt end ``P`` (``store_cap(num_prompt)``: the prompt, after the
request's store limits), reported horizons ``h`` (after the same limits), and
``last(h)`` = the largest admissible boundary of a producer knowing ``h`` tokens:

* ``dense``: every admissible boundary.
* ``end``: at the first report ``h >= P``, the prompt's ends (``prompt_ends``): the last
  boundary below the prompt's last token (where a longer prompt sharing this one hits,
  and what native offloading serves), and ``P`` itself when ``P`` is a boundary, since a
  repeat of the prompt takes its whole-prompt hit there (``coverage.consumer_hit``); then
  ``last(h)`` for every report ``h > P``. In a layout without whole-prompt hits (a state
  group) only the first: a repeat could never load what ``P`` needs. A producer that
  reports at its prompt end and at its request end (the replay; an engine storing once
  prefill is done) serves exactly those; one that reports every decoding step serves
  every boundary its answer passes. Reports inside a chunked prefill serve nothing.
* ``shared``: ``end``, plus the *shared point* ``s``: the largest consumer-admissible
  boundary at which every full-attention group's required chunks were in the store (or on
  the device) when the request looked up, i.e. where it was seen to share a prefix with an
  earlier request. ``s`` is served once ``last(h) >= s``. The first request of a document
  serves only its end; a second one sharing the document serves its divergence point,
  where a third then hits. A layout with no full-attention group has ``s = 0``.

Only the groups ``prunable`` names are pruned; the others store, in every mode, what
``dense`` stores. Which ones weighs what a chunk costs against the hits it serves, per
group kind: a full-attention chunk serves every later boundary (its store set is the
prefix up to the largest served boundary anyway); a sliding-window chunk serves only the
boundaries within one window of it, so serving few boundaries stores a few windows instead
of nearly every chunk, and the hits it gives up are those in the middle of a prefix (vLLM's
own offloading serves a window only at each prompt's end, too). A chunked-local chunk
serves every boundary up to the end of its attention chunk (``C`` tokens, 8,192 for Llama
4), as a full-attention chunk does within that span, and native offloading serves them
all: pruning it loses hits native has, so it is pruned only when the user asks
(``prune_chunked_local``). A state group holds one state per boundary, useful at that
boundary only: pruned.

Example: granularity 16, a 100-token prompt, ``shared`` with ``s = 64``, reports at 40
(chunked prefill), 100 and 120: 40 serves nothing, 100 serves 64 and 96, 120 serves 112.
With a 96-token prompt, ``end`` at 96 serves 80 and 96: the same prompt again hits at 96,
restoring 95 tokens, and a longer one sharing it at 96 or 80.

Every computation on boundaries and chunks is a ``kvtier.coverage`` call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from kvtier import coverage
from kvtier.layout import Group, Layout

BoundaryMode = Literal["dense", "end", "shared"]
BOUNDARY_MODES: tuple[BoundaryMode, ...] = ("dense", "end", "shared")


def check_mode(mode: str) -> None:
    """``ValueError`` naming the known modes, for a mode that is not one of them."""
    if mode not in BOUNDARY_MODES:
        raise ValueError(f"boundaries must be one of {', '.join(BOUNDARY_MODES)}; got {mode!r}")


def prunable(group: Group, *, prune_chunked_local: bool = False) -> bool:
    """Whether ``end`` and ``shared`` store only the served boundaries' chunks of ``group``
    (see the module docstring for the weighing).

    False for full attention (its store set is a prefix: ``coverage.needs_predecessor``)
    and, unless ``prune_chunked_local``, for chunked local; True for sliding window and
    state groups.
    """
    if group.kind == "chunked_local":
        return prune_chunked_local
    return not coverage.needs_predecessor(group)


def last_boundary(layout: Layout, horizon: int) -> int:
    """The largest admissible boundary of a producer knowing ``horizon`` tokens, or 0.

    Example: granularity 16, no draft layers: 100 -> 96; 15 -> 0.
    """
    bounds = coverage.admissible_boundaries(layout, horizon)
    return bounds[-1] if bounds else 0


def consumer_end(layout: Layout, prompt_end: int, num_prompt: int | None = None) -> int:
    """The largest boundary a consumer of the prompt can hit, or 0: the last of
    ``prompt_ends``.

    Example: granularity 16: a 100-token prompt -> 96; a 96-token prompt -> 96 (its
    whole-prompt hit), or 80 in a layout with a 16-token state group.
    """
    ends = prompt_ends(layout, prompt_end, num_prompt)
    return ends[-1] if ends else 0


def prompt_ends(layout: Layout, prompt_end: int, num_prompt: int | None = None) -> list[int]:
    """The boundaries ``end`` serves at the prompt's end, ascending: the last boundary below
    the prompt's last token (where a longer prompt sharing this one hits, as native
    offloading serves it), and the prompt's end itself where a repeat of the prompt takes
    its whole-prompt hit there (``coverage.consumer_hit``). Admissible for ``prompt_end``
    tokens and a consumer of ``num_prompt`` (by default ``prompt_end``; larger when store
    limits cut the prompt short).

    Example: granularity 16: a 100-token prompt -> [96]; a 96-token prompt -> [80, 96],
    or [80] in a layout with a 16-token state group.
    """
    n = prompt_end if num_prompt is None else num_prompt
    bounds = coverage.admissible_boundaries(layout, prompt_end, n)
    if not bounds:
        return []
    whole = bounds[-1] == n  # a boundary past the last token: the whole-prompt hit's
    return list(bounds[-2:]) if whole else [bounds[-1]]


def newly_served(
    layout: Layout, mode: BoundaryMode, last_served: int, horizon: int, *,
    prompt_end: int, num_prompt: int | None = None, shared: int = 0,
) -> list[int]:
    """Boundaries a producer starts serving at a report of ``horizon`` tokens, ascending,
    all past ``last_served`` (the largest it already serves, 0 for none). ``prompt_end`` is
    the prompt after store limits, ``num_prompt`` the whole prompt (default: the same).

    Examples, granularity 16, ``prompt_end`` 100: ``dense`` from 32 at 70 -> [48, 64];
    ``end`` at 70 -> [], at 98 -> [96] (before the prompt's end: chunked prefill) and at 100
    -> [96]; ``shared`` with ``shared=64`` at 100 -> [64, 96]. ``prompt_end`` 96: ``end`` at
    96 -> [80, 96] and at 128 -> [80, 96, 128].
    """
    check_mode(mode)
    if mode == "dense":
        return [b for b in coverage.admissible_boundaries(layout, horizon) if b > last_served]
    top = last_boundary(layout, horizon)
    fresh = {shared} if mode == "shared" and shared <= top else set()
    # each of the prompt's ends as soon as the horizon admits it: a step of chunked prefill
    # that ends past it still holds its window, the prompt's last step may not
    fresh.update(b for b in prompt_ends(layout, prompt_end, num_prompt) if b <= top)
    if horizon > prompt_end:
        fresh.add(top)
    return sorted(b for b in fresh if b > last_served)


def served_boundaries(
    layout: Layout, mode: BoundaryMode, reports: Sequence[int], *, prompt_end: int,
    num_prompt: int | None = None, shared: int = 0,
) -> list[int]:
    """Every boundary a producer serves after reporting ``reports`` (ascending horizons).

    Example: granularity 16, ``end``, prompt end 100, reports 40, 100, 160: [96, 160].
    """
    served: list[int] = []
    for h in reports:
        served += newly_served(layout, mode, served[-1] if served else 0, h,
                               prompt_end=prompt_end, num_prompt=num_prompt, shared=shared)
    return served


def shared_point(layout: Layout, num_prompt: int, present: Sequence[int]) -> int:
    """The largest consumer-admissible boundary whose full-attention chunks are present.

    ``present[gi]`` is the number of leading chunks of group ``gi`` present (in the store
    or on the device); only full-attention groups are read. 0 when the layout has none.
    Example: one full group of 16-token chunks, a 90-token prompt, 4 chunks present: 64.
    """
    full = [gi for gi, g in enumerate(layout.groups) if coverage.needs_predecessor(g)]
    if not full:
        return 0
    for b in reversed(coverage.admissible_boundaries(layout, num_prompt, num_prompt)):
        if all(coverage.required(layout.groups[gi], b).stop <= present[gi] for gi in full):
            return b
    return 0
