"""Recurrent (``state``) layers restored through kvtier equal their cold computation.

A state group keeps, at boundary ``b``, the state after token ``b - 1`` (DESIGN section 3),
one state per chunk. These tests run hybrid models of the reference engine (full attention or
a sliding window next to gated-delta-net layers) cold, then restored from kvtier's tiers (host
memory; disk after a restart or an eviction; Redis from a second store), and compare tokens
and logits; the restore matrix over prompt lengths is in ``test_restore_matrix.py``
(``HYBRIDS`` are among its layouts).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from e2e_helpers import (
    HOST_BYTES,
    HYBRIDS,
    MAX_TOKENS,
    assert_same_generation,
    cold_then_reset,
    expected_hit,
    prompt,
    run,
)

from kvtier import coverage
from kvtier.engine import Completion, Engine, EngineConfig, reference_generate
from kvtier.engine.attention import attend, attention_mask
from kvtier.integrations.reference import KvtierOffloader
from kvtier.keys import KeyChain
from kvtier.tiers.config import DiskConfig, HostConfig, RedisConfig, TierConfig
from kvtier.tiers.tiered import TieredStore
from tiers.tier_helpers import REDIS_SERVER, RedisServer


@pytest.mark.parametrize("layout", sorted(HYBRIDS))
def test_the_paged_engine_equals_the_dense_reference(layout: str) -> None:
    # The recurrent states the engine keeps in blocks, piece after piece, give what one
    # uninterrupted run from a zero state gives.
    config = HYBRIDS[layout]()
    [done] = run(Engine(config), [prompt(29)], max_tokens=4)
    tokens, logits = reference_generate(Engine(config).model, prompt(29), max_tokens=4)
    assert list(done.output_token_ids) == tokens
    torch.testing.assert_close(done.logits, logits, rtol=1e-5, atol=1e-5)


def test_a_state_hit_loads_one_state_and_the_attention_chunks() -> None:
    config = HYBRIDS["full-state"]()
    [cold], [warm], offloader = cold_then_reset(config, [prompt(35)])
    assert warm.num_restored_tokens == 32
    # full chunks 0..3 and the state chunk ending at 32 (the state after token 31)
    assert offloader.metrics.chunks_loaded == 4 + 1
    layout = config.layout()
    assert offloader.metrics.bytes_loaded == (4 * layout.groups[0].bytes_per_chunk
                                              + layout.groups[1].bytes_per_state)
    assert_same_generation(warm, cold)


class Recorder:
    """A ``StateIO`` for a run from token 0 that keeps every state it is given."""

    def __init__(self, config: EngineConfig) -> None:
        self.numel = config.recurrent_shape.state_numel
        self.rows: dict[int, torch.Tensor] = {}

    def load(self, layer: int) -> torch.Tensor:
        return torch.zeros(self.numel)

    def save(self, layer: int, rows: torch.Tensor) -> None:
        self.rows[layer] = rows


def recomputed_states(config: EngineConfig, tokens: list[int]) -> dict[int, torch.Tensor]:
    """Per recurrent layer, the state after every token, from one dense run."""
    model = Engine(config).model
    assert config.layer_groups is not None
    groups = config.layer_groups

    def dense(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
        mask = attention_mask(config.groups[groups[layer]], positions, positions)
        return attend(q, k, v, mask)

    recorder = Recorder(config)
    with torch.no_grad():
        model.hidden(tokens, torch.arange(len(tokens)), dense, recorder)
    return recorder.rows


@pytest.mark.parametrize("layout", ["full-state", "window-state"])
def test_each_stored_state_is_the_recomputed_state_after_its_chunks_last_token(
    layout: str,
) -> None:
    config = HYBRIDS[layout]()
    tokens = prompt(35)
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    run(Engine(config, offloader), [tokens])
    states = recomputed_states(config, tokens)
    layers = sorted(states)  # the slot holds the group's layers in order
    for chunk in range(4):  # boundaries 8, 16, 24, 32: states after tokens 7, 15, 23, 31
        stored = stored_state(offloader, tokens, chunk).view(len(layers), -1)
        expected = torch.stack([states[layer][8 * chunk + 7] for layer in layers])
        torch.testing.assert_close(stored, expected, rtol=1e-5, atol=1e-5)
        wrong = torch.stack([states[layer][8 * chunk + 6] for layer in layers])
        assert not torch.allclose(stored, wrong, rtol=1e-3, atol=1e-3)  # one token earlier


@pytest.mark.parametrize("length", [15, 16, 17])
def test_one_state_per_token_allows_a_whole_prompt_hit(length: int) -> None:
    config = HYBRIDS["state-per-token"]()
    [cold], [warm], _ = cold_then_reset(config, [prompt(length)])
    assert warm.num_restored_tokens == expected_hit(config, length) == {15: 8, 16: 15, 17: 16}[
        length]
    assert_same_generation(warm, cold)


def test_with_a_state_of_64_tokens_a_prompt_ending_on_a_boundary_hits_one_chunk_less() -> None:
    config = HYBRIDS["full-state"]()
    assert not coverage.whole_prompt_hit(config.layout(), 32)
    [_], [warm], _ = cold_then_reset(config, [prompt(32)])
    assert warm.num_restored_tokens == 24


@pytest.mark.parametrize("layout", ["full-state", "window-state"])
@pytest.mark.parametrize("shared", [31, 32, 33])
def test_a_consumer_that_diverges_restores_the_state_of_the_last_boundary_before(
    layout: str, shared: int
) -> None:
    config = HYBRIDS[layout]()
    producer = prompt(44)
    consumer = producer[:shared] + [(t + 1) % 256 for t in producer[shared:]]
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    engine = Engine(config, offloader)
    run(engine, [producer])
    engine.reset_device_cache()
    [warm] = run(engine, [consumer])
    [alone] = run(Engine(config), [consumer])
    assert warm.num_restored_tokens == expected_hit(config, len(consumer), shared=shared) > 0
    assert_same_generation(warm, alone)


@pytest.mark.parametrize("layout", sorted(HYBRIDS))
def test_a_multi_turn_chat_hits_each_previous_turn(layout: str) -> None:
    # Each turn's prompt is the last turn's prompt, its answer and a new message: the hit
    # covers the answer too (the stored horizon ends before the last answer token).
    config = HYBRIDS[layout]()
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    engine, alone = Engine(config, offloader), Engine(config)
    history: list[int] = prompt(13)
    previous = 0
    for turn in range(3):
        [warm] = run(engine, [history], max_tokens=4)
        [cold] = run(alone, [history], max_tokens=4)
        assert_same_generation(warm, cold)
        if turn:
            stored = previous + 4 - 1
            assert warm.num_restored_tokens == expected_hit(config, len(history), shared=stored)
            assert warm.num_restored_tokens > previous - config.layout().hit_granularity
        previous = len(history)
        history = [*history, *warm.output_token_ids, *prompt(7 + turn, salt=turn + 1)]


@pytest.mark.parametrize("layout", ["full-state", "state-blocks"])
def test_many_requests_at_once_each_restore_their_own_state(layout: str) -> None:
    config = HYBRIDS[layout]()
    lengths = [17, 24, 31, 33, 40, 49]
    prompts = [prompt(n, salt) for salt, n in enumerate(lengths)]
    cold, warm, offloader = cold_then_reset(config, prompts)
    for n, c, w in zip(lengths, cold, warm, strict=True):
        assert w.num_restored_tokens == expected_hit(config, n) > 0
        assert_same_generation(w, c)
    offloader.close()
    offloader.planner.check_quiescent()
    offloader.store.check_invariants()


def stored_state(offloader: KvtierOffloader, tokens: list[int], chunk: int) -> torch.Tensor:
    """The fp32 values of one stored state chunk (group 1), a view of its host slot."""
    key = KeyChain(offloader.layout, offloader.namespace, tokens).key(1, chunk)
    assert key is not None
    store = offloader.store
    handle = store.prepare_load([key])  # also proves the chunk is stored
    store.complete_load(handle)
    nbytes = offloader.layout.groups[1].bytes_per_chunk
    assert nbytes is not None
    slot = store.backend.view(handle.slots[0])  # type: ignore[attr-defined]
    return torch.frombuffer(slot[:nbytes], dtype=torch.float32)


def largest_recurrent_element(config: EngineConfig, values: torch.Tensor) -> int:
    """Index of the largest delta-rule state value (not the conv state: a conv input only
    reaches the next few tokens' queries, which may never reach a logit)."""
    shape = config.recurrent_shape
    rows = values.view(-1, shape.state_numel)
    recurrent = rows[:, shape.conv_numel :].abs()
    layer, i = divmod(int(torch.argmax(recurrent)), recurrent.shape[1])
    return layer * shape.state_numel + shape.conv_numel + i


def restore_corrupted(length: int, scale: float) -> tuple[Completion, Completion]:
    """Cold, then warm after scaling one element of the restored state by ``scale``."""
    config = HYBRIDS["full-state"]()
    tokens = prompt(length)
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    engine = Engine(config, offloader)
    [cold] = run(engine, [tokens], max_tokens=MAX_TOKENS)
    hit = expected_hit(config, length)
    values = stored_state(offloader, tokens, chunk=hit // 8 - 1)  # the state after hit - 1
    values[largest_recurrent_element(config, values)] *= scale
    engine.reset_device_cache()
    [warm] = run(engine, [tokens], max_tokens=MAX_TOKENS)
    assert warm.num_restored_tokens == hit  # the corrupt state was restored
    return cold, warm


@pytest.mark.parametrize("length", [19, 27, 35, 43, 51])
def test_negative_control_one_corrupt_state_element_changes_the_tokens(length: int) -> None:
    cold, warm = restore_corrupted(length, scale=64.0)
    assert warm.output_token_ids != cold.output_token_ids


def test_negative_control_one_negated_state_element_fails_the_comparison() -> None:
    cold, warm = restore_corrupted(35, scale=-1.0)
    with pytest.raises(AssertionError):
        assert_same_generation(warm, cold)


def tiered(path: Path, config: EngineConfig, host_slots: int = 0) -> TieredStore:
    """Host memory over a disk directory: ``host_slots`` slots written back to disk as they
    are evicted, or (0) room for everything, every chunk written through to disk."""
    slot = config.layout().max_bytes_per_chunk
    host = HostConfig(capacity=host_slots * slot if host_slots else HOST_BYTES,
                      pin_memory=False)
    tiers = TierConfig(host=host, disk=DiskConfig(path=str(path), capacity="64MiB", fsync=False),
                       write_policy="write-back" if host_slots else "write-through")
    return TieredStore.from_config(tiers, config.layout())


def test_a_state_evicted_to_disk_is_promoted_and_restored(tmp_path: Path) -> None:
    config = HYBRIDS["full-state"]()
    first, second = prompt(35), prompt(35, salt=1)
    with tiered(tmp_path, config, host_slots=8) as store:
        with KvtierOffloader(config.layout(), store) as offloader:
            engine = Engine(config, offloader)
            [cold] = run(engine, [first])  # 8 chunks: 4 full, 4 states
            run(engine, [second])  # 8 more push the first down to disk
            engine.reset_device_cache()
            assert store.flush()
            [warm] = run(engine, [first])
        stats = store.stats()
    assert stats["disk"]["promoted"] >= 4 + 1  # at least the hit: 4 full chunks, the state
    assert warm.num_restored_tokens == 32
    assert_same_generation(warm, cold)


@pytest.mark.parametrize("layout", ["full-state", "window-state"])
def test_a_restarted_process_restores_the_state_from_disk(tmp_path: Path, layout: str) -> None:
    config = HYBRIDS[layout]()
    tokens = prompt(37)
    with tiered(tmp_path, config) as store, KvtierOffloader(config.layout(), store) as first:
        [cold] = run(Engine(config, first), [tokens])
    with tiered(tmp_path, config) as store:  # a new host slab, empty: only the disk remains
        with KvtierOffloader(config.layout(), store) as offloader:
            [warm] = run(Engine(config, offloader), [tokens])
            assert offloader.metrics.waits == 1  # promoted from disk, then loaded
        assert store.stats()["disk"]["promoted"] >= 5
    assert warm.num_restored_tokens == 32
    assert_same_generation(warm, cold)


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not on PATH (CI installs it)")
def test_a_second_node_restores_the_state_from_redis(tmp_path: Path) -> None:
    # Two stores that share only a Redis server, as two serving processes would.
    config = HYBRIDS["window-state"]()
    tokens = prompt(37)
    server = RedisServer(tmp_path)
    server.start()
    try:
        # a timeout a loaded CI machine cannot reach (the default 0.5 s was, once): this
        # test is about what is restored, not about a slow server
        tiers = TierConfig(host=HostConfig(capacity=HOST_BYTES, pin_memory=False),
                           redis=RedisConfig(url=server.url, timeout_s=10.0),
                           write_policy="write-through")
        with TieredStore.from_config(tiers, config.layout()) as store, \
                KvtierOffloader(config.layout(), store) as producer:
            [cold] = run(Engine(config, producer), [tokens])
        with TieredStore.from_config(tiers, config.layout()) as store, \
                KvtierOffloader(config.layout(), store) as consumer:
            [warm] = run(Engine(config, consumer), [tokens])
            assert consumer.metrics.waits == 1  # promoted from Redis, then loaded
    finally:
        server.stop()
    assert warm.num_restored_tokens == 32
    assert_same_generation(warm, cold)
