"""Hypothesis strategies for layouts and requests, shared by property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from kvtier.layout import Group, Layout


@st.composite
def groups(draw: st.DrawFn, *, allow_lookahead: bool = True) -> Group:
    kind = draw(st.sampled_from(["full", "sliding_window", "chunked_local", "state"]))
    tpb = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    bpc = draw(st.integers(1, 4))
    kw: dict[str, int] = {}
    if kind == "sliding_window":
        kw["window"] = draw(st.integers(1, 80))
        kw["extra_retained"] = draw(st.integers(0, 5))
    if kind == "chunked_local":
        kw["chunk"] = draw(st.integers(1, 96))
    if kind != "state" and allow_lookahead:
        kw["lookahead"] = draw(st.sampled_from([0, 0, 0, 1, 2, 3]))
    tail = "recomputed" if kw.get("lookahead") and draw(st.booleans()) else "stored"
    return Group(kind, tpb, bpc, draft_tail=tail, **kw)  # type: ignore[arg-type]


@st.composite
def layouts(draw: st.DrawFn, *, allow_lookahead: bool = True) -> Layout:
    gs = tuple(draw(st.lists(groups(allow_lookahead=allow_lookahead), min_size=1, max_size=3)))
    layout = Layout(gs)
    if layout.hit_granularity <= 48 and draw(st.booleans()):
        layout = Layout(gs, hit_granularity=layout.hit_granularity * draw(st.integers(1, 3)))
    return layout
