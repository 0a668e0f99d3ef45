"""The seeds' scenarios (shared/seeds), run through vLLM's Scheduler with kvtier.

Each bug was the lookup, the producer's store and the allocator's restore disagreeing.
Here, for every case: the blocks vLLM's allocator holds below the hit are exactly
``coverage.retained_blocks``; every one of them is loaded (the lookup checked its chunk,
since a load is only ever what ``required`` names); every loaded chunk was stored by the
producer; and the restored KV equals a cold computation.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from vllm_helpers import (
    allocated_below,
    chunks,
    make_sim,
    metrics,
    produce_then_consume,
    required,
    retained_blocks,
    scheduled,
)

from kvtier.integrations.vllm.testing import SimGroup, SpecStandIn

pytestmark = pytest.mark.vllm


def _run(groups, chunk_tokens, prompt_len, hit, draft=None, extra_retained=0) -> None:
    spec = None
    if draft:
        groups = [*groups, SimGroup("full", 16, eagle=True)]
        spec = SpecStandIn(draft, num_speculative_tokens=extra_retained + 1)
    sim = make_sim(groups, chunk_tokens, spec=spec, lookahead=1 if draft else 0)
    prompt = list(range(500, 500 + prompt_len))
    out = produce_then_consume(sim, prompt, prompt)
    assert metrics(sim)["hit_tokens"] == hit
    assert scheduled(out, "consumer") == prompt_len - hit
    assert allocated_below(sim, "consumer", hit) == retained_blocks(sim, hit)
    loaded = chunks(sim, "load", "consumer")
    assert loaded == required(sim, hit)
    assert loaded <= chunks(sim, "store", "producer")
    assert sim.check_restored("consumer", hit) == []
    sim.run()
    sim.close()


@pytest.mark.parametrize("draft", [None, "eagle", "mtp"])
@pytest.mark.parametrize("extra_retained", [0, 1, 3])
def test_seed_000_mtp_retained_history(extra_retained: int, draft: str | None) -> None:
    """64-token hit, 16-token SWA blocks and chunks, window 32, E extra retained tokens:
    with E = 3 the allocator restores chunk 1 too, so lookup and producer must cover it."""
    groups = [SimGroup("full", 16), SimGroup("swa", 16, window=32, extra_retained=extra_retained)]
    _run(groups, 16, prompt_len=65, hit=64, draft=draft, extra_retained=extra_retained)


@pytest.mark.parametrize("prompt_len,hit", [(113, 64), (177, 128), (65, 64), (129, 128)])
@pytest.mark.parametrize("draft", [None, "eagle"])
def test_seed_002_partial_final_segment(prompt_len: int, hit: int, draft: str | None) -> None:
    """64-token alignment over 16-token SWA blocks, final segment partial (48 of 64): the
    consumer's hit is the last whole segment and every chunk it needs was stored."""
    groups = [SimGroup("full", 16), SimGroup("swa", 16, window=32)]
    _run(groups, 64, prompt_len=prompt_len, hit=hit, draft=draft)
