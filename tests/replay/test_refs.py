"""A request's references and prompt chain, hashed once (``RefsPlanner``: the prompt's
chain forked over the rest of the stored scope), against the reference: a fresh
``KeyChain`` over the request's token stream."""

from __future__ import annotations

import pytest

from kvtier.keys import KeyChain
from kvtier.layout import Layout
from kvtier.presets import gpt_oss_120b, llama_3_1_8b, with_eagle
from kvtier.replay.refs import RefsPlanner, replay_namespace, token_stream
from kvtier.replay.synth import SynthConfig, synthetic_source
from kvtier.replay.trace import TraceRequest

BLOCK = 64


def reference(layout: Layout, req: TraceRequest, num_tokens: int) -> KeyChain:
    return KeyChain(layout, replay_namespace(layout),
                    token_stream(req.hash_ids, BLOCK)[:num_tokens])


def conversations() -> list[TraceRequest]:
    """Multi-round conversations: every round's ids start with the previous round's."""
    spec = SynthConfig(users=6, turns=4, system_tokens=300, user_tokens=90, output_tokens=70)
    return list(synthetic_source(spec, block_tokens=BLOCK)())


@pytest.mark.parametrize("layout", [gpt_oss_120b(), with_eagle(llama_3_1_8b())],
                         ids=["hybrid", "draft"])
@pytest.mark.parametrize("scope", ["blocks", "prompt"])
def test_refs_keys_and_prompt_chain_equal_a_fresh_chain_over_the_stream(layout, scope):
    planner = RefsPlanner(layout, replay_namespace(layout), BLOCK, scope)
    reqs = conversations()
    assert any(r.hash_ids[:2] == s.hash_ids[:2] for r in reqs for s in reqs if r is not s)
    for req in reqs:
        refs = planner.refs(req)
        whole = reference(layout, req, refs.store_tokens)
        assert refs.keys == [whole.key(g, c) for g, c in zip(refs.groups, refs.chunks,
                                                             strict=True)]
        prompt = reference(layout, req, req.input_length)
        assert refs.prompt.num_tokens == req.input_length
        assert [refs.prompt.keys(g, range(req.input_length // grp.tokens_per_chunk))
                for g, grp in enumerate(layout.groups)] == [
            prompt.keys(g, range(req.input_length // grp.tokens_per_chunk))
            for g, grp in enumerate(layout.groups)]


def test_a_request_whose_ids_diverge_gets_other_keys_from_there():
    layout = llama_3_1_8b()  # 256-token chunks: 4 blocks of 64 each
    planner = RefsPlanner(layout, replay_namespace(layout), BLOCK, "blocks")
    first = planner.refs(TraceRequest(0.0, 1024, 1, tuple(range(16))))
    other = planner.refs(TraceRequest(1.0, 1024, 1, (*range(6), 99, *range(7, 16))))
    assert other.keys[:1] == first.keys[:1]  # chunk 0: blocks 0..3, shared
    assert not set(other.keys[1:]) & set(first.keys[1:])  # block 6 is in chunk 1
    req = TraceRequest(1.0, 1024, 1, (*range(6), 99, *range(7, 16)))
    whole = reference(layout, req, 1024)
    assert other.keys == whole.keys(0, range(4))
