"""Restored KV equals recomputed KV, on a real forward pass, over a matrix of layouts.

For each layout and each prompt length at, just below and just above a chunk or boundary
multiple: generate cold, clear the engine's device cache (kvtier's host tier stays),
generate again. The second run must restore exactly the largest admissible boundary
<= prompt - 1 through kvtier, and produce the same tokens and logits.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from e2e_helpers import (
    HOST_BYTES,
    LAYOUTS,
    assert_same_generation,
    cold_then_reset,
    edge_lengths,
    expected_chunks,
    expected_hit,
    prompt,
    run,
)

from kvtier.engine import Engine
from kvtier.integrations.reference import KvtierOffloader

CASES = [(name, n) for name, make in LAYOUTS.items() for n in edge_lengths(make())]


@pytest.mark.parametrize(("layout", "length"), CASES, ids=[f"{a}-{n}" for a, n in CASES])
def test_restored_generation_equals_cold(layout: str, length: int) -> None:
    config = LAYOUTS[layout]()
    [cold], [warm], offloader = cold_then_reset(config, [prompt(length)])
    hit = expected_hit(config, length)
    assert cold.num_restored_tokens == 0
    assert warm.num_restored_tokens == hit
    metrics = offloader.metrics
    assert metrics.hit_tokens == hit
    assert metrics.chunks_loaded == expected_chunks(config, hit)
    assert (metrics.bytes_loaded > 0) == (hit > 0)
    assert_same_generation(warm, cold)
    offloader.close()
    offloader.planner.check_quiescent()
    offloader.store.check_invariants()


@pytest.mark.parametrize("layout", ["window-E3", "block-sizes", "three-groups"])
def test_many_requests_at_once_each_restore_their_own_prefix(layout: str) -> None:
    config = LAYOUTS[layout]()
    lengths = edge_lengths(config)[-6:]
    prompts = [prompt(n, salt) for salt, n in enumerate(lengths)]
    cold, warm, offloader = cold_then_reset(config, prompts)
    for n, c, w in zip(lengths, cold, warm, strict=True):
        assert w.num_restored_tokens == expected_hit(config, n)
        assert_same_generation(w, c)
    offloader.close()


def test_aligned_prefill_pieces_restore_bit_for_bit() -> None:
    # Pieces of 8 tokens divide every boundary, so from the hit on the restored run computes
    # exactly the pieces the cold run did: the same shapes, hence the same bits.
    config = replace(LAYOUTS["window-E1"](), max_prefill_tokens=8)
    [cold], [warm], _ = cold_then_reset(config, [prompt(35)])
    assert warm.num_restored_tokens == 32
    assert warm.output_token_ids == cold.output_token_ids
    assert torch.equal(warm.logits, cold.logits)


@pytest.mark.parametrize("restart", ["same-offloader", "shared-store"])
def test_tiers_outlive_the_engine(restart: str) -> None:
    config = LAYOUTS["window-E3"]()
    first = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    [cold] = run(Engine(config, first), [prompt(27)])
    if restart == "same-offloader":
        second = first
    else:
        first.close()
        second = KvtierOffloader(config.layout(), first.store)
    [warm] = run(Engine(config, second), [prompt(27)])
    assert warm.num_restored_tokens == 24
    assert_same_generation(warm, cold)
    second.close()
