"""Speculative decoding changes no token: greedy verification equals the dense reference."""

from __future__ import annotations

import pytest
import torch
from engine_doubles import prompt

from kvtier.engine import Engine, EngineConfig, GroupSpec, reference_generate
from kvtier.engine.speculative_config import SpeculativeConfig

SPECS = [SpeculativeConfig("mtp", 1, 1), SpeculativeConfig("mtp", 4, 2),
         SpeculativeConfig("mtp", 3, 3), SpeculativeConfig("eagle", 2),
         SpeculativeConfig("mtp", 4, 2, force_rejections=True),
         SpeculativeConfig("eagle", 2, force_rejections=True)]


def config(spec: SpeculativeConfig) -> EngineConfig:
    groups = (GroupSpec("full", tokens_per_block=4),
              GroupSpec("sliding_window", tokens_per_block=4, window=6))
    return EngineConfig(groups=groups, speculative=spec, max_prefill_tokens=7)


def _id(spec: SpeculativeConfig) -> str:
    forced = "-forced" if spec.force_rejections else ""
    return f"{spec.method}-k{spec.num_speculative_tokens}-K{spec.num_modules}{forced}"


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_speculative_tokens_equal_the_dense_reference(spec: SpeculativeConfig) -> None:
    cfg = config(spec)
    engine = Engine(cfg)
    prompts = [prompt(n, n) for n in (1, 22)]
    for p, done in zip(prompts, engine.generate(prompts, max_tokens=9), strict=True):
        tokens, logits = reference_generate(engine.model, p, 9)
        assert list(done.output_token_ids) == tokens
        torch.testing.assert_close(done.logits, logits, atol=1e-4, rtol=1e-4)
        assert done.num_drafted_tokens >= 8 // (spec.num_speculative_tokens + 1)
        if spec.force_rejections:  # every step rewinds k - 1 provisional draft positions
            assert done.num_accepted_tokens == 0 and done.num_reprefilled_tokens > 0
    assert all(engine.num_free_blocks(g) == cfg.num_blocks for g in range(len(engine.kv_caches)))


def test_speculative_layout_follows_the_presets() -> None:
    layout = config(SpeculativeConfig("mtp", 4, 2)).layout()
    assert [g.lookahead for g in layout.groups] == [0, 0, 1, 2, 0]
    assert layout.groups[1].extra_retained == 3  # E = k - 1
    assert [g.draft_tail for g in layout.groups[2:4]] == ["recomputed"] * 2
    assert layout.groups[-1].kind == "state" and layout.groups[-1].tokens_per_block == 4
    with pytest.raises(ValueError, match="num_modules must be 1"):
        SpeculativeConfig("eagle", 2, num_modules=2)
