"""A store job's keys and parent hints (``ChunkBinder.keys_and_parents``), found per run of
one group's chunks, are exactly each chunk's ``KeyChain.key`` and, where a hit needs both
(full attention), its predecessor's: for runs that are contiguous, start at chunk 0, skip
chunks, repeat or interleave groups, and for a draft group."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import coverage
from kvtier.keys import KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.planner.binding import ChunkBinder
from kvtier.planner.requests import RequestState
from kvtier.planner.types import RequestLimits

LAYOUT = Layout((Group("full", 4, 2), Group("sliding_window", 4, 2, window=6),
                 Group("full", 4, 2, lookahead=1)))
NS = Namespace("binder-keys")
CHAIN = KeyChain(LAYOUT, NS, range(200))  # 25 chunks of 8 tokens per group, and a draft tail


def by_key(pairs: list[tuple[int, int]]) -> tuple[list[bytes | None], list[bytes | None]]:
    """The reference: one ``KeyChain.key`` per chunk, its predecessor's for full attention."""
    keys = [CHAIN.key(gi, c) for gi, c in pairs]
    parents = [CHAIN.key(gi, c - 1)
               if c and coverage.needs_predecessor(LAYOUT.groups[gi]) else None
               for gi, c in pairs]
    return keys, parents


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 23)), max_size=30),
       st.booleans())
def test_keys_and_parents_equal_each_chunks_own(pairs: list[tuple[int, int]],
                                                ordered: bool) -> None:
    if ordered:  # the planner's usual order: group outermost, ascending
        pairs = sorted(set(pairs))
    req = RequestState("r", CHAIN, CHAIN.num_tokens, RequestLimits())
    keys, parents = ChunkBinder(LAYOUT).keys_and_parents(req, pairs)
    assert (keys, parents) == by_key(pairs)


def test_negative_control_a_parent_one_chunk_off_differs() -> None:
    req = RequestState("r", CHAIN, CHAIN.num_tokens, RequestLimits())
    _, parents = ChunkBinder(LAYOUT).keys_and_parents(req, [(0, c) for c in (3, 4, 5)])
    assert parents == [CHAIN.key(0, c) for c in (2, 3, 4)]
    assert parents != [CHAIN.key(0, c) for c in (3, 4, 5)]
