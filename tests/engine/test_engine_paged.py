"""Paged decoding equals the dense reference (no paging, full recompute each step)."""

from __future__ import annotations

import pytest
import torch
from engine_doubles import mixed_config, prompt

from kvtier.engine import Engine, EngineConfig, GroupSpec, reference_generate

LAYOUTS = {
    "full": (GroupSpec("full", num_layers=2, tokens_per_block=4),),
    # W = 6 is not a multiple of the 4-token block.
    "sliding": (GroupSpec("sliding_window", num_layers=2, tokens_per_block=4, window=6),),
    "sliding_extra": (
        GroupSpec("sliding_window", num_layers=1, tokens_per_block=2, window=5,
                  extra_retained=3),
    ),
    "chunked": (GroupSpec("chunked_local", num_layers=2, tokens_per_block=4, chunk=8),),
    # C = 6 is not a multiple of the block: a freed block is allocated again.
    "chunked_unaligned": (GroupSpec("chunked_local", num_layers=1, tokens_per_block=4,
                                    chunk=6),),
    "mixed": mixed_config().groups,
}

TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def run_and_compare(config: EngineConfig, lengths: list[int], max_tokens: int) -> None:
    engine = Engine(config)
    prompts = [prompt(n, salt) for salt, n in enumerate(lengths)]
    completions = engine.generate(prompts, max_tokens=max_tokens)
    for p, done in zip(prompts, completions, strict=True):
        tokens, logits = reference_generate(engine.model, p, max_tokens)
        assert list(done.output_token_ids) == tokens
        torch.testing.assert_close(done.logits, logits, **TOLERANCE)


@pytest.mark.parametrize("max_prefill_tokens", [5, 64])
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_paged_batch_matches_dense_reference(name: str, max_prefill_tokens: int) -> None:
    config = EngineConfig(groups=LAYOUTS[name], max_prefill_tokens=max_prefill_tokens)
    run_and_compare(config, lengths=[1, 13, 30], max_tokens=8)


def test_more_requests_than_max_running_wait_their_turn() -> None:
    config = mixed_config(max_running=2, max_prefill_tokens=7)
    run_and_compare(config, lengths=[9, 17, 4, 22], max_tokens=3)


def test_chunked_prefill_equals_one_shot_prefill() -> None:
    prompts = [prompt(37, 1), prompt(20, 2)]
    one_shot = Engine(mixed_config(max_prefill_tokens=64)).generate(prompts, max_tokens=5)
    chunked = Engine(mixed_config(max_prefill_tokens=3)).generate(prompts, max_tokens=5)
    for a, b in zip(one_shot, chunked, strict=True):
        assert a.output_token_ids == b.output_token_ids
        torch.testing.assert_close(a.logits, b.logits, **TOLERANCE)


def test_explicit_layer_to_group_map_is_used() -> None:
    groups = (GroupSpec("full", num_layers=1), GroupSpec("sliding_window", num_layers=2,
                                                         window=3))
    config = EngineConfig(groups=groups, layer_groups=(1, 1, 0))
    assert [len(t) for t in Engine(config).kv_caches] == [1, 2]
    run_and_compare(config, lengths=[11], max_tokens=4)


def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    p = [prompt(12, 3)]
    a = Engine(mixed_config(seed=1)).generate(p, max_tokens=6)[0]
    b = Engine(mixed_config(seed=1)).generate(p, max_tokens=6)[0]
    c = Engine(mixed_config(seed=2)).generate(p, max_tokens=6)[0]
    assert torch.equal(a.logits, b.logits)
    assert not torch.allclose(a.logits, c.logits)
