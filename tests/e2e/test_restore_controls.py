"""Partial hits, a negative control, failures, and a wait resolved through the real parts."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch
from e2e_helpers import (
    HOST_BYTES,
    LAYOUTS,
    Faults,
    assert_same_generation,
    cold_then_reset,
    expected_hit,
    prompt,
    run,
)

from kvtier.engine import Engine
from kvtier.integrations.reference import KvtierOffloader
from kvtier.keys import KeyChain
from kvtier.transfer import ChunkCopy


@pytest.mark.parametrize("layout", ["window-E3", "block-sizes", "chunked-local"])
@pytest.mark.parametrize("shared", [31, 32, 33, 40])
def test_consumer_that_diverges_hits_at_the_last_boundary_before(layout: str, shared: int):
    config = LAYOUTS[layout]()
    producer = prompt(52)
    consumer = producer[:shared] + [(t + 1) % 256 for t in producer[shared:]]
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    engine = Engine(config, offloader)
    run(engine, [producer])
    engine.reset_device_cache()
    [warm] = run(engine, [consumer])
    [cold] = run(Engine(config), [consumer])  # the engine alone, no kvtier
    hit = expected_hit(config, len(consumer), shared=shared)
    assert hit > 0 and warm.num_restored_tokens == hit
    assert_same_generation(warm, cold)


def flip_chunk(offloader: KvtierOffloader, tokens: list[int], group: int, chunk: int) -> None:
    """Negate every fp32 value of one stored chunk, in its host slot."""
    key = KeyChain(offloader.layout, offloader.namespace, tokens).key(group, chunk)
    assert key is not None
    store = offloader.store
    handle = store.prepare_load([key])  # also proves the chunk is stored
    store.complete_load(handle)
    assert store.backend is not None
    nbytes = offloader.layout.groups[group].bytes_per_chunk
    assert nbytes is not None
    slot = store.backend.view(handle.slots[0])  # type: ignore[attr-defined]
    slot[3:nbytes:4] ^= 0x80


@pytest.mark.parametrize("group", [0, 1])
def test_negative_control_a_flipped_chunk_fails_the_comparison(group: int) -> None:
    config = LAYOUTS["window-E3"]()
    tokens = prompt(35)
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    engine = Engine(config, offloader)
    [cold] = run(engine, [tokens])
    flip_chunk(offloader, tokens, group, chunk=3)  # tokens 24..31, just before the hit at 32
    engine.reset_device_cache()
    [warm] = run(engine, [tokens])
    assert warm.num_restored_tokens == 32  # the corrupt chunk was restored ...
    with pytest.raises(AssertionError):  # ... and the comparison sees it
        assert_same_generation(warm, cold)


def test_a_failed_load_is_recomputed_and_counted() -> None:
    config = LAYOUTS["window-E1"]()
    faults = Faults()
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES, fault=faults)
    engine = Engine(config, offloader)
    [cold] = run(engine, [prompt(27)])
    faults.armed = True
    engine.reset_device_cache()
    [warm] = run(engine, [prompt(27)])
    assert warm.num_restored_tokens == 0
    assert_same_generation(warm, cold)
    assert offloader.metrics.load_failures == 1
    assert offloader.last_failure is not None and offloader.last_failure.direction == "load"
    assert all(engine.num_free_blocks(g) == config.num_blocks for g in range(2))


def test_failed_stores_never_become_visible() -> None:
    config = LAYOUTS["window-E0"]()
    faults = Faults()
    faults.armed = True
    cold, warm, offloader = cold_then_reset(
        config, [prompt(27)], KvtierOffloader.for_engine(config, HOST_BYTES, fault=faults)
    )
    assert warm[0].num_restored_tokens == 0
    assert_same_generation(warm[0], cold[0])
    assert offloader.metrics.store_failures >= 1 and offloader.metrics.chunks_stored == 0
    assert len(offloader.store) == 0


class GatedStores:
    """Holds every store copy until ``open`` is set (loads pass), as a slow data plane."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def __call__(self, copy: ChunkCopy) -> None:
        assert self.open.wait(timeout=30), "the gate was never opened"


class Draining(KvtierOffloader):
    """Opens the gate when the offloader drains: the only way the test can proceed."""

    gate: GatedStores

    def drain(self) -> None:
        self.gate.open.set()
        super().drain()


def test_a_lookup_that_must_wait_completes_the_stores_in_flight() -> None:
    config = LAYOUTS["full"]()
    gate = GatedStores()
    offloader = Draining(config.layout(), KvtierOffloader.for_engine(config, HOST_BYTES).store,
                         fault=gate)
    offloader.gate = gate
    engine = Engine(replace(config, max_prefill_tokens=64), offloader)
    first = engine.add_request(prompt(27), max_tokens=3)
    engine.step()  # first computes its whole prompt; its stores are held at the gate
    second = engine.add_request(prompt(27), max_tokens=3)
    while engine.has_unfinished():
        engine.step()
    assert offloader.metrics.waits == 1
    assert engine.get_request(second).num_restored_tokens == 24
    assert engine.get_request(second).output_token_ids == engine.get_request(first).output_token_ids
    torch.testing.assert_close(
        torch.stack(engine.get_request(second).output_logits),
        torch.stack(engine.get_request(first).output_logits), rtol=1e-5, atol=1e-5,
    )


def kvtier_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("kvtier-")}


def test_an_offloader_dropped_without_close_stops_its_threads() -> None:
    before = kvtier_threads()
    config = LAYOUTS["full"]()
    engine = Engine(config, KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES))
    run(engine, [prompt(20)])
    assert sorted(t.name for t in kvtier_threads() - before) == ["kvtier-load", "kvtier-store"]
    del engine  # the only reference to the offloader
    assert kvtier_threads() == before
