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
* ``end``: at the first report ``h >= P``, the prompt's *consumer end* ``c``: the largest
  boundary a consumer with this very prompt can hit (the largest admissible boundary below
  the prompt's last token, which a consumer computes for its logits); then ``last(h)``
  for every report ``h > P``. ``c = last(P)`` unless ``P`` is a boundary itself, where
  ``c`` is the boundary before it: serving ``P`` would store partial-window chunks that a
  repeat of the prompt can never load. A producer that reports at its prompt end and at
  its request end (the replay; an engine storing once prefill is done) serves exactly
  those two; one that reports every decoding step serves every boundary its answer
  passes. Reports inside a chunked prefill serve nothing.
* ``shared``: ``end``, plus the *shared point* ``s``: the largest consumer-admissible
  boundary at which every full-attention group's required chunks were in the store (or on
  the device) when the request looked up, i.e. where it was seen to share a prefix with an
  earlier request. ``s`` is served once ``last(h) >= s``. The first request of a document
  serves only its end; a second one sharing the document serves its divergence point,
  where a third then hits. A layout with no full-attention group has ``s = 0``.

Only partial-window groups are pruned (``prunable``): a full-attention group's store set
is the prefix up to the largest served boundary, so it is stored whole in every mode.

Example: granularity 16, a 100-token prompt, ``shared`` with ``s = 64``, reports at 40
(chunked prefill), 100 and 120: 40 serves nothing, 100 serves 64 and 96, 120 serves 112.
With a 96-token prompt, ``end`` at 96 serves 80: the same prompt again hits at 80.

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


def prunable(group: Group) -> bool:
    """Whether serving fewer boundaries stores fewer chunks of ``group``.

    False for full attention (its store set is a prefix: ``coverage.needs_predecessor``),
    True for sliding window, chunked local and state groups.
    """
    return not coverage.needs_predecessor(group)


def last_boundary(layout: Layout, horizon: int) -> int:
    """The largest admissible boundary of a producer knowing ``horizon`` tokens, or 0.

    Example: granularity 16, no draft layers: 100 -> 96; 15 -> 0.
    """
    bounds = coverage.admissible_boundaries(layout, horizon)
    return bounds[-1] if bounds else 0


def consumer_end(layout: Layout, prompt_end: int, num_prompt: int | None = None) -> int:
    """The largest boundary a consumer of the prompt can hit, or 0: admissible for
    ``prompt_end`` tokens and below the prompt's last token (``num_prompt``, by default
    ``prompt_end``; larger when store limits cut the prompt short).

    Example: granularity 16: a 100-token prompt -> 96; a 96-token prompt -> 80.
    """
    bounds = coverage.admissible_boundaries(
        layout, prompt_end, prompt_end if num_prompt is None else num_prompt)
    return bounds[-1] if bounds else 0


def newly_served(
    layout: Layout, mode: BoundaryMode, last_served: int, horizon: int, *,
    prompt_end: int, num_prompt: int | None = None, shared: int = 0,
) -> list[int]:
    """Boundaries a producer starts serving at a report of ``horizon`` tokens, ascending,
    all past ``last_served`` (the largest it already serves, 0 for none). ``prompt_end`` is
    the prompt after store limits, ``num_prompt`` the whole prompt (default: the same).

    Examples, granularity 16, ``prompt_end`` 100: ``dense`` from 32 at 70 -> [48, 64];
    ``end`` at 70 -> [] and at 100 -> [96]; ``shared`` with ``shared=64`` at 100 -> [64, 96].
    ``prompt_end`` 96: ``end`` at 96 -> [80] and at 112 -> [80, 112].
    """
    check_mode(mode)
    if mode == "dense":
        return [b for b in coverage.admissible_boundaries(layout, horizon) if b > last_served]
    top = last_boundary(layout, horizon)
    out = []
    if mode == "shared" and last_served < shared <= top:
        out.append(shared)
    if horizon >= prompt_end:
        ends = [consumer_end(layout, prompt_end, num_prompt)]
        if horizon > prompt_end:
            ends.append(top)
        for b in ends:
            if b > max(last_served, out[-1] if out else 0):
                out.append(b)
    return out


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
    full = [gi for gi, g in enumerate(layout.groups) if not prunable(g)]
    if not full:
        return 0
    for b in reversed(coverage.admissible_boundaries(layout, num_prompt, num_prompt)):
        if all(coverage.required(layout.groups[gi], b).stop <= present[gi] for gi in full):
            return b
    return 0
