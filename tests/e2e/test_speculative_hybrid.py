"""Speculative decoding on a hybrid target: MTP and EAGLE over recurrent (``state``) layers.

A verify step runs the target's recurrent layers over the drafts too; only the state after the
last accepted token may be kept (``kvtier.engine.states``), or the next step starts from a
state that has seen rejected drafts. Greedy speculative decoding must give exactly the tokens
of plain greedy decoding, so the dense reference (no cache, no drafts) is the oracle, cold and
after a hit; acceptance counts after a warm hit must equal cold.
"""

from __future__ import annotations

import pytest
from e2e_helpers import expected_hit, prompt
from test_speculative import SPECS, assert_same, cold_and_warm

from kvtier.engine import Engine, EngineConfig, GroupSpec, reference_generate
from kvtier.engine.speculative_config import SpeculativeConfig

TARGETS = {
    "full-state": (GroupSpec("full", tokens_per_block=4, blocks_per_chunk=2),
                   GroupSpec("state", num_layers=2, tokens_per_block=4, blocks_per_chunk=2)),
    "window-state": (GroupSpec("sliding_window", tokens_per_block=4, blocks_per_chunk=2,
                               window=10),
                     GroupSpec("state", tokens_per_block=4, blocks_per_chunk=2)),
}


def hybrid(target: str, spec: SpeculativeConfig) -> EngineConfig:
    return EngineConfig(groups=TARGETS[target], speculative=spec, max_prefill_tokens=5,
                        num_blocks=96)


def greedy(config: EngineConfig, tokens: list[int], max_tokens: int) -> tuple[int, ...]:
    """Plain greedy decoding by full recomputation: what speculation must reproduce."""
    return tuple(reference_generate(Engine(config).model, tokens, max_tokens)[0])


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_hit_on_a_hybrid_keeps_tokens_and_acceptance(target: str, name: str) -> None:
    config = hybrid(target, SPECS[name])
    lengths = (16, 17, 25)
    prompts = [prompt(n, salt) for salt, n in enumerate(lengths)]
    cold, warm, loads = cold_and_warm(config, prompts, max_tokens=10)
    for n, p, c, w in zip(lengths, prompts, cold, warm, strict=True):
        assert w.num_restored_tokens == expected_hit(config, n) > 0
        assert_same(w, c)
        assert c.output_token_ids == greedy(config, p, 10)
    assert sum(c.num_accepted_tokens for c in cold) > 0  # acceptance is not vacuous
    assert all(len(job["g1-state"]) == 1 for job in loads)  # one state per hit


def test_rejected_drafts_never_reach_the_kept_state() -> None:
    # Every draft replaced by a wrong token: each verify step runs the recurrent layers over
    # k wrong tokens and keeps one. Cold runs without rejections, warm with them.
    spec = SpeculativeConfig("mtp", num_speculative_tokens=4, num_modules=2)
    config = hybrid("full-state", spec)
    forced = hybrid("full-state", SpeculativeConfig("mtp", 4, 2, force_rejections=True))
    tokens = prompt(27)
    [cold], [warm], _ = cold_and_warm(config, [tokens], 12, warm_config=forced)
    assert warm.num_restored_tokens == 24
    assert warm.output_token_ids == cold.output_token_ids == greedy(config, tokens, 12)
    assert warm.num_rejected_tokens >= warm.num_drafted_tokens - 2 > 0
    assert warm.num_reprefilled_tokens > 0


def test_the_seed_layout_with_a_recurrent_group_loads_one_state_and_one_hidden_block() -> None:
    # The first seed's numbers (16-token blocks, MTP k = 4 with two modules, a 65-token
    # prompt) with recurrent layers in place of the sliding window.
    spec = SpeculativeConfig("mtp", num_speculative_tokens=4, num_modules=2)
    groups = (GroupSpec("full", tokens_per_block=16), GroupSpec("state", tokens_per_block=16))
    config = EngineConfig(groups=groups, speculative=spec, max_prefill_tokens=32, num_blocks=24)
    tokens = list(range(10, 75))
    [cold], [warm], loads = cold_and_warm(config, [tokens], max_tokens=16)
    assert warm.num_restored_tokens == 64
    assert loads == [{"g0-full": [0, 1, 2, 3], "g1-state": [3], "mtp1": [0, 1, 2],
                      "mtp2": [0, 1, 2], "hidden": [3]}]
    assert_same(warm, cold)
    assert cold.output_token_ids == greedy(config, tokens, 16)
