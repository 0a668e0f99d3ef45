"""A request's references and prompt chain (``RefsPlanner``), keyed by a ``ReplayChain``:
its keys must name the same prefixes as a ``KeyChain`` over the request's token stream
(equal exactly where those are equal), however the chain is fed or forked."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.keys import ChunkKey, KeyChain
from kvtier.layout import Group, Layout
from kvtier.presets import gpt_oss_120b, llama_3_1_8b, with_eagle
from kvtier.replay.refs import RefsPlanner, ReplayChain, replay_namespace, token_stream
from kvtier.replay.synth import SynthConfig, synthetic_source
from kvtier.replay.trace import TraceRequest

BLOCK = 64


def reference(layout: Layout, ids: tuple[int, ...], block: int, num_tokens: int) -> KeyChain:
    return KeyChain(layout, replay_namespace(layout), token_stream(ids, block)[:num_tokens])


class SamePrefixes:
    """Pairs (replay key, token-hash key) seen so far: ``add`` fails unless each key of one
    kind always goes with the same key of the other (a bijection: equal where equal)."""

    def __init__(self) -> None:
        self.to_token: dict[ChunkKey, ChunkKey] = {}
        self.to_replay: dict[ChunkKey, ChunkKey] = {}

    def add(self, replay: list[ChunkKey], token: list[ChunkKey]) -> None:
        assert len(replay) == len(token)
        for r, t in zip(replay, token, strict=True):
            assert self.to_token.setdefault(r, t) == t, "one replay key, two prefixes"
            assert self.to_replay.setdefault(t, r) == r, "one prefix, two replay keys"

    def add_chains(self, replay: KeyChain, token: KeyChain) -> None:
        assert replay.num_tokens == token.num_tokens
        for g, group in enumerate(replay.layout.groups):
            chunks = range((token.num_tokens - group.lookahead) // group.tokens_per_chunk)
            self.add(replay.keys(g, chunks), token.keys(g, chunks))


def conversations() -> list[TraceRequest]:
    """Multi-round conversations: every round's ids start with the previous round's."""
    spec = SynthConfig(users=6, turns=4, system_tokens=300, user_tokens=90, output_tokens=70)
    return list(synthetic_source(spec, block_tokens=BLOCK)())


@pytest.mark.parametrize("layout", [gpt_oss_120b(), with_eagle(llama_3_1_8b())],
                         ids=["hybrid", "draft"])
@pytest.mark.parametrize("scope", ["blocks", "prompt"])
def test_refs_and_prompt_chain_name_the_prefixes_a_token_hash_names(layout, scope):
    planner = RefsPlanner(layout, replay_namespace(layout), BLOCK, scope)
    reqs = conversations()
    assert any(r.hash_ids[:2] == s.hash_ids[:2] for r in reqs for s in reqs if r is not s)
    same = SamePrefixes()
    for req in reqs:
        refs = planner.refs(req)
        whole = reference(layout, req.hash_ids, BLOCK, refs.store_tokens)
        same.add(refs.keys, [whole.key(g, c) for g, c in zip(refs.groups, refs.chunks,
                                                             strict=True)])
        assert refs.prompt.num_tokens == req.input_length
        same.add_chains(refs.prompt, reference(layout, req.hash_ids, BLOCK, req.input_length))
    shared = len(same.to_token)
    assert shared < sum(len(planner.refs(r).keys) for r in reqs)  # prefixes were shared


def test_the_check_fails_on_a_chain_that_loses_an_ids_high_half():
    """Negative control: ids 5 and 2**32 + 5 differ only in their high halves; a chain
    fed the low halves alone gives both prompts one key, and the check says so."""
    layout = llama_3_1_8b()
    same = SamePrefixes()
    with pytest.raises(AssertionError, match="one replay key, two prefixes"):
        for ids in ((1, 5, 7, 8), (1, 2**32 + 5, 7, 8)):
            chain = ReplayChain(layout, replay_namespace(layout), BLOCK)
            chain.extend_blocks(tuple(i % 2**32 for i in ids), 4 * BLOCK)
            same.add_chains(chain, reference(layout, ids, BLOCK, 4 * BLOCK))


def test_a_request_whose_ids_diverge_gets_other_keys_from_there():
    layout = llama_3_1_8b()  # 256-token chunks: 4 blocks of 64 each
    planner = RefsPlanner(layout, replay_namespace(layout), BLOCK, "blocks")
    first = planner.refs(TraceRequest(0.0, 1024, 1, tuple(range(16))))
    other = planner.refs(TraceRequest(1.0, 1024, 1, (*range(6), 99, *range(7, 16))))
    assert other.keys[:1] == first.keys[:1]  # chunk 0: blocks 0..3, shared
    assert not set(other.keys[1:]) & set(first.keys[1:])  # block 6 is in chunk 1


@st.composite
def small_layouts(draw: st.DrawFn) -> Layout:
    """One or two groups of 1-16-token chunks (units that do and do not divide a block),
    a draft group among them sometimes."""
    groups = [Group("full", draw(st.integers(1, 8)), blocks_per_chunk=draw(st.integers(1, 2)),
                    lookahead=draw(st.sampled_from([0, 0, 1, 3])))
              for _ in range(draw(st.integers(1, 2)))]
    return Layout(tuple(groups))


IDS = [0, 5, 2**32 + 5, 2**32, 7, 2**64 - 1]  # pairs that share a half


@settings(max_examples=150, deadline=None)
@given(small_layouts(), st.integers(1, 7), st.integers(0, 2**32), st.data())
def test_any_block_size_feeding_or_fork_names_the_same_prefixes(layout, block, seed, data):
    rng, same = random.Random(seed), SamePrefixes()
    for _ in range(12):
        ids = tuple(rng.choice(IDS) for _ in range(rng.randrange(1, 6)))
        stream = token_stream(ids, block)
        n = rng.randrange(1, len(stream) + 1)
        cut = rng.randrange(0, n + 1)
        chain = ReplayChain(layout, replay_namespace(layout), block)
        how = data.draw(st.sampled_from(["ids", "tokens", "ids, fork, tokens", "tokens, ids",
                                         "packed ids"]))
        if how == "ids":
            chain.extend_blocks(ids, n)
        elif how == "packed ids":  # the ids packed once by the caller, read twice
            packed = struct.pack(f"<{len(ids)}Q", *ids)
            chain.extend_blocks(ids, cut, packed)
            chain.extend_blocks(ids, n, packed)
        elif how == "tokens":
            chain.extend(stream[:cut])
            chain.extend(stream[cut:n])
        elif how == "ids, fork, tokens":
            chain.extend_blocks(ids, cut)
            twin = chain.fork()
            chain.extend(stream[cut : cut + 1])  # the original moves on apart
            same.add_chains(chain, reference(layout, ids, block, min(cut + 1, len(stream))))
            chain = twin
            chain.extend(stream[cut:n])
        else:
            chain.extend(stream[:cut])
            chain.extend_blocks(ids, n)
        same.add_chains(chain, reference(layout, ids, block, n))


def test_tokens_that_are_not_a_replay_stream_are_refused_and_change_nothing():
    layout = llama_3_1_8b()
    ids = (7, 2**32 + 9, 11)
    stream = token_stream(ids, BLOCK)
    chain = ReplayChain(layout, replay_namespace(layout), BLOCK)
    chain.extend_blocks(ids, 100)  # into block 1
    for bad in ([*stream[100:120].tolist()[:-1], 8],  # the last token breaks the pattern
                stream[100:200][::-1].copy(),  # block 1's halves swapped
                [1] * 40):
        with pytest.raises(ValueError, match="keys replay streams only"):
            chain.extend(bad)
        assert chain.num_tokens == 100
    chain.extend(stream[100:])  # the chain still takes its stream, and keys it right
    same = SamePrefixes()
    same.add_chains(chain, reference(layout, ids, BLOCK, len(stream)))
    with pytest.raises(ValueError, match="3 ids of 64 tokens name 192 tokens, not 193"):
        chain.extend_blocks(ids, 193)
    assert chain.num_tokens == len(stream)


def test_packed_ids_of_the_wrong_length_are_refused_and_change_nothing():
    layout = llama_3_1_8b()
    ns = replay_namespace(layout)
    chain, plain = ReplayChain(layout, ns, BLOCK), ReplayChain(layout, ns, BLOCK)
    ids = (7, 8, 9, 10)
    with pytest.raises(ValueError, match="8 per id"):
        chain.extend_blocks(ids, 2 * BLOCK, struct.pack("<3Q", 7, 8, 9))
    assert chain.num_tokens == 0
    packed = struct.pack("<4Q", *ids)
    chain.extend_blocks(ids, BLOCK + 5, packed)  # then from inside block 1: read at 8 bytes
    chain.extend_blocks(ids, 4 * BLOCK, packed)  # per id from there
    plain.extend_blocks(ids, 4 * BLOCK)
    assert chain.keys(0, range(1)) == plain.keys(0, range(1))
