"""Restored KV gives the same tokens and logits as KV computed cold; corrupt KV does not."""

from __future__ import annotations

import itertools

import pytest
import torch
from engine_doubles import SnapshotCache, mixed_config, prompt

from kvtier.engine import Completion, Engine, EngineConfig, NullOffloader, Request

LENGTHS = (19, 27, 33)  # hits at 16, 24, 32 (granularity 8)


def run(engine: Engine, prompts: list[list[int]], tag: str) -> list[Completion]:
    """Generate with request ids ``{tag}-0``, ``{tag}-1``, ... (unique across engines)."""
    ids = [engine.add_request(p, max_tokens=6, request_id=f"{tag}-{i}")
           for i, p in enumerate(prompts)]
    done: dict[str, Completion] = {}
    while engine.has_unfinished():
        done.update((c.request_id, c) for c in engine.step())
    return [done[i] for i in ids]


def cold_then_warm(
    config: EngineConfig, cache: SnapshotCache, fresh_engine: bool = True
) -> tuple[list[Completion], list[Completion]]:
    """Run the prompts cold (recording), then again restored from the cache."""
    prompts = [prompt(n, salt) for salt, n in enumerate(LENGTHS)]
    engine = Engine(config, cache)
    cold = run(engine, prompts, "cold")
    if fresh_engine:
        engine = Engine(config, cache)
    else:
        engine.reset_device_cache()
    warm = run(engine, prompts, "warm")
    return cold, warm


@pytest.mark.parametrize("fresh_engine", [True, False])
def test_restored_run_is_bitwise_identical_to_cold_run(fresh_engine: bool) -> None:
    # max_prefill_tokens divides every hit, so the restored run computes the same pieces
    # as the cold run from the hit on: same shapes, same bits.
    config = mixed_config(max_prefill_tokens=8)
    cold, warm = cold_then_warm(config, SnapshotCache(config.layout()), fresh_engine)
    for c, w in zip(cold, warm, strict=True):
        assert c.num_restored_tokens == 0
        assert w.num_restored_tokens == 8 * ((len(c.prompt_token_ids) - 1) // 8)
        assert w.output_token_ids == c.output_token_ids
        assert torch.equal(w.logits, c.logits)


def test_restored_run_with_other_prefill_pieces_matches_within_rounding() -> None:
    config = mixed_config(max_prefill_tokens=5)
    cold, warm = cold_then_warm(config, SnapshotCache(config.layout()))
    for c, w in zip(cold, warm, strict=True):
        assert w.num_restored_tokens > 0
        assert w.output_token_ids == c.output_token_ids
        torch.testing.assert_close(w.logits, c.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group", [0, 1])
def test_negative_control_a_corrupt_restored_block_changes_the_output(group: int) -> None:
    config = mixed_config(max_prefill_tokens=8)
    cache = SnapshotCache(config.layout())
    # The last block before the 32-token hit of the 33-token prompt: read by position 32 in
    # the full group and inside the window of the sliding one.
    cache.corrupt = (group, 7)
    cold, warm = cold_then_warm(config, cache)
    assert warm[2].num_restored_tokens == 32
    assert not torch.allclose(warm[2].logits, cold[2].logits, atol=1e-3)
    assert torch.equal(warm[0].logits, cold[0].logits)  # its hit at 16 has no block 7


def test_a_failed_load_is_recomputed_from_the_start() -> None:
    config = mixed_config(max_prefill_tokens=8)
    cache = SnapshotCache(config.layout())
    cold, _ = cold_then_warm(config, cache)
    cache.fail_loads = True
    engine = Engine(config, cache)
    [again] = run(engine, [list(cold[1].prompt_token_ids)], "failed")
    assert again.num_restored_tokens == 0
    assert again.output_token_ids == cold[1].output_token_ids
    assert torch.equal(again.logits, cold[1].logits)
    names = cache.events.names("failed-0")
    assert names[:5] == ["lookup", "on_allocated", "wait_loaded", "before_free", "on_computed"]
    assert all(engine.num_free_blocks(g) == config.num_blocks for g in range(3))


def check_hook_order(names: list[str], restored: bool, max_tokens: int) -> None:
    """The call order documented in kvtier.engine.hooks."""
    head = ["lookup", "on_allocated", "wait_loaded"] if restored else ["lookup", "on_allocated"]
    assert names[: len(head)] == head
    body = names[len(head) :]
    assert "wait_loaded" not in body and "lookup" not in body
    assert body[0] == "on_computed" and body[-2:] == ["on_finished", "before_free"]
    assert body.count("on_finished") == 1
    for before, after in itertools.pairwise(body):
        if after == "before_free":
            assert before in ("on_computed", "on_finished")
    assert body.count("on_computed") >= max_tokens


def test_hook_call_order_cold_and_restored() -> None:
    config = mixed_config(max_prefill_tokens=8)
    cache = SnapshotCache(config.layout())
    cold_then_warm(config, cache)
    check_hook_order(cache.events.names("cold-2"), restored=False, max_tokens=6)
    check_hook_order(cache.events.names("warm-2"), restored=True, max_tokens=6)
    # 33-token prompt restored at 32: one prefill piece, then 5 decode steps.
    assert cache.events.names("warm-2").count("on_computed") == 6


class BadHit(NullOffloader):
    def __init__(self, hit: object) -> None:
        self.hit = hit

    def lookup(self, request: Request) -> int:
        return self.hit  # type: ignore[return-value]


@pytest.mark.parametrize("hit", [3, 12, -4, 1.0, True])
def test_a_hit_the_engine_cannot_use_is_a_clear_error(hit: object) -> None:
    engine = Engine(mixed_config(), BadHit(hit))
    engine.add_request(prompt(12, 0), max_tokens=1)
    with pytest.raises(ValueError, match="multiple of 4"):
        engine.step()
