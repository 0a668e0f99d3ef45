"""Chains hashed once: ``KeyChain.fork`` and a planner that takes the caller's prompt chain.
Each is compared with a fresh ``KeyChain`` over the same tokens (the reference), with
negative controls over other tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.keys import KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.planner import Outcome, Planner
from kvtier.store import ChunkStore

PLAIN = Layout((Group("full", 16), Group("sliding_window", 4, window=8)))
ODD = Layout((Group("full", 12),))
DRAFT = Layout((Group("full", 16), Group("full", 16, lookahead=2, name="draft")))
NS = Namespace("test-model")


def all_keys(chain: KeyChain) -> list[list[object]]:
    """Every key of every group the chain's tokens determine."""
    return [[chain.key(g, c) for c in range(chain.num_tokens // group.tokens_per_chunk + 1)]
            for g, group in enumerate(chain.layout.groups)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=80), st.integers(0, 80),
       st.lists(st.integers(0, 9), min_size=1, max_size=40),
       st.sampled_from([PLAIN, ODD, DRAFT]), st.sampled_from(["sha256", "blake2b"]))
def test_a_fork_anywhere_equals_a_fresh_chain(tokens, cut, other, layout, hash_name):
    ns = Namespace("m", hash_name=hash_name)
    base = KeyChain(layout, ns, tokens[:cut])
    twin = base.fork()
    twin.extend(tokens[cut:])
    base.extend(other)
    assert all_keys(twin) == all_keys(KeyChain(layout, ns, tokens))
    assert all_keys(base) == all_keys(KeyChain(layout, ns, [*tokens[:cut], *other]))


@pytest.mark.parametrize("layout", [PLAIN, DRAFT])
def test_a_fork_extends_apart_from_its_chain(layout):
    base = KeyChain(layout, NS, range(30))
    twin = base.fork()
    twin.extend(range(30, 70))
    base.extend(range(100, 140))  # the negative control: other tokens, other keys
    assert all_keys(twin) == all_keys(KeyChain(layout, NS, range(70)))
    assert all_keys(base) == all_keys(KeyChain(layout, NS, [*range(30), *range(100, 140)]))
    assert twin.keys(0, range(1, 4)) != base.keys(0, range(1, 4))


def planner(layout: Layout = PLAIN) -> Planner:
    return Planner(layout, ChunkStore(100), NS)


def store_prompt(p: Planner, rid: str, prompt) -> None:
    p.add_request(rid, prompt)
    tables = [list(range(64 // g.tokens_per_block)) for g in p.layout.groups]
    job = p.on_computed(rid, 64, tables)
    assert job is not None
    p.complete_store(job.id, True)
    p.finish(rid)


def test_the_planner_takes_a_prompt_chain_as_its_tokens():
    tokens = list(range(64))
    by_tokens, by_chain = planner(), planner()
    chain = KeyChain(PLAIN, NS, tokens)
    store_prompt(by_tokens, "a", tokens)
    store_prompt(by_chain, "a", chain)
    assert chain.num_tokens == 64  # the caller's chain is the planner's no more than a copy
    for p in (by_tokens, by_chain):  # each finds what the other stored: the same keys
        p.add_request("b", [*tokens, 99])
        assert p.lookup("b", 0).outcome is Outcome.HIT
    control = planner()
    store_prompt(control, "a", KeyChain(PLAIN, NS, [t + 1 for t in tokens]))
    control.add_request("b", [*tokens, 99])
    assert control.lookup("b", 0).outcome is Outcome.MISS


def test_the_planner_extends_a_fork_never_the_callers_chain():
    p, chain = planner(), KeyChain(PLAIN, NS, range(20))
    p.add_request("a", chain)
    p.append_tokens("a", range(20, 40))
    assert chain.num_tokens == 20


@pytest.mark.parametrize(("chain", "salt"), [
    (KeyChain(PLAIN, Namespace("other-model"), range(20)), None),
    (KeyChain(ODD, NS, range(20)), None),
    (KeyChain(PLAIN, NS, range(20)), "tenant-a"),  # the salt makes another namespace
])
def test_the_planner_refuses_a_chain_of_another_layout_or_namespace(chain, salt):
    with pytest.raises(ValueError, match="another layout or namespace"):
        planner().add_request("a", chain, salt=salt)


def test_the_planner_takes_a_salted_chain_under_its_salt():
    salted = Namespace(**{**vars(NS), "tenant_salt": "tenant-a"})
    p = planner()
    p.add_request("a", KeyChain(PLAIN, salted, range(20)), salt="tenant-a")
    assert p.num_requests == 1


@pytest.mark.parametrize("layout", [PLAIN, ODD, DRAFT])
def test_a_fork_extended_continues_its_source_and_its_sibling(layout):
    source = KeyChain(layout, NS, range(30))
    sibling, longer = source.fork(), source.fork()
    longer.extend(range(30, 70))
    assert longer.continues(source) and longer.continues(sibling)
    assert all_keys(longer) == all_keys(KeyChain(layout, NS, range(70)))
    assert not source.continues(longer)  # the other way round
    assert not longer.continues(KeyChain(layout, NS, range(30)))  # equal tokens, no lineage
    sibling.extend([5])  # no longer the length the fork was made at
    assert not longer.continues(sibling)
    late = source.fork()  # a fork made after the source grew: another point
    source.extend(range(30, 40))
    assert not longer.continues(source) and not late.continues(source)


def test_the_planner_takes_a_chain_that_continues_the_requests_as_its_new_tokens():
    tokens = list(range(64))
    prompt = KeyChain(PLAIN, NS, tokens[:40])
    whole = prompt.fork()
    whole.extend(tokens[40:])
    by_tokens, by_chain = planner(), planner()
    for p, rest in ((by_tokens, tokens[40:]), (by_chain, whole)):
        p.add_request("a", prompt)
        p.append_tokens("a", rest)
        job = p.on_computed("a", 64, [[*range(4)], [*range(16)]])
        assert job is not None
        p.complete_store(job.id, True)
        p.finish("a")
        p.add_request("b", [*tokens, 99])
        assert p.lookup("b", 0).hit_tokens == 64  # the whole 64 tokens stored, same keys


def test_the_planner_refuses_a_chain_that_does_not_continue_the_requests():
    p = planner()
    prompt = KeyChain(PLAIN, NS, range(40))
    p.add_request("a", prompt)
    unrelated = KeyChain(PLAIN, NS, range(64))  # the same tokens, but not a fork: unproven
    with pytest.raises(ValueError, match="does not continue the request's own"):
        p.append_tokens("a", unrelated)
    p.append_tokens("a", range(40, 64))  # the request is unharmed
    assert p.on_computed("a", 64, [[*range(4)], [*range(16)]]) is not None


@pytest.mark.parametrize("layout", [PLAIN, DRAFT])
def test_a_frozen_chain_refuses_tokens_and_its_forks_take_them(layout):
    chain = KeyChain(layout, NS, range(30))
    before = all_keys(chain)
    chain.freeze()
    with pytest.raises(ValueError, match="frozen"):
        chain.extend(range(30, 40))
    assert chain.frozen and chain.num_tokens == 30 and all_keys(chain) == before
    twin = chain.fork()
    twin.extend(range(30, 70))
    assert not twin.frozen
    assert all_keys(twin) == all_keys(KeyChain(layout, NS, range(70)))


def test_a_frozen_replay_chain_refuses_blocks():
    from kvtier.replay.refs import ReplayChain, replay_namespace, token_stream

    layout = Layout((Group("full", 16),))
    chain = ReplayChain(layout, replay_namespace(layout), 16)
    chain.extend_blocks((3, 4), 20)
    chain.freeze()
    for extend in (lambda: chain.extend_blocks((3, 4), 32),
                   lambda: chain.extend(token_stream((3, 4), 16)[20:32])):
        with pytest.raises(ValueError, match="frozen"):
            extend()
    assert chain.num_tokens == 20


@pytest.mark.parametrize("rest", ["tokens", "chain"])
def test_the_planner_takes_a_frozen_chain_and_forks_it_only_to_extend_it(rest):
    """A frozen prompt chain is the request's own until the request grows: tokens given
    to ``append_tokens`` extend a fork (the caller's chain is unchanged), a chain that
    continues it replaces it. Either way the keys stored are those of the tokens."""
    tokens = list(range(64))
    prompt = KeyChain(PLAIN, NS, tokens[:40])
    whole = prompt.fork()
    whole.extend(tokens[40:])
    prompt.freeze()
    p = planner()
    p.add_request("a", prompt)
    p.append_tokens("a", tokens[40:] if rest == "tokens" else whole)
    job = p.on_computed("a", 64, [[*range(4)], [*range(16)]])
    assert job is not None
    p.complete_store(job.id, True)
    p.finish("a")
    assert prompt.num_tokens == 40 and prompt.frozen
    p.add_request("b", [*tokens, 99])
    assert p.lookup("b", 0).hit_tokens == 64
    p.add_request("c", [*(t + 1 for t in tokens), 99])  # the negative control
    assert p.lookup("c", 0).outcome is Outcome.MISS
