"""Bad values through the library: refused at construction, never accepted silently; and
memory that does not grow with a tier's capacity before it is used."""

from __future__ import annotations

import math
import tracemalloc

import pytest

from kvtier.keys import Namespace
from kvtier.layout import Group, Layout
from kvtier.planner import Planner
from kvtier.replay.synth import SynthConfig, generate
from kvtier.replay.timing import TimingModel
from kvtier.store import ChunkStore, SlotAllocator
from kvtier.tiers.host import HostSlab

NON_FINITE = [math.nan, math.inf, -math.inf]
NAN_INF = [math.nan, math.inf]


@pytest.mark.parametrize("value", NON_FINITE)
def test_planner_wait_timeout_must_be_finite(value: float) -> None:
    layout = Layout((Group("full", 16),))
    with pytest.raises(ValueError, match="wait_timeout_s must be a finite number >= 0"):
        Planner(layout, ChunkStore(4), Namespace("m"), wait_timeout_s=value)


@pytest.mark.parametrize("field", ["host_gb_per_s", "load_latency_ms", "first_token_ms"])
@pytest.mark.parametrize("value", NAN_INF)
def test_timing_model_refuses_non_finite(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"timing: {field} must be"):
        TimingModel(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["think_time_s", "arrival_rate_per_s", "decode_tokens_per_s"])
@pytest.mark.parametrize("value", NON_FINITE)
def test_synth_config_refuses_non_finite(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"synthetic: {field} must be a finite number"):
        SynthConfig(**{field: value})  # type: ignore[arg-type]


def test_synthetic_trace_size_is_capped_before_generating() -> None:
    with pytest.raises(ValueError, match="at most 2,000,000: lower users, turns"):
        generate(SynthConfig(users=10**9))


def test_slot_allocator_is_lazy() -> None:
    """A hundred million slots cost nothing until handed out (a list of them was 3.9 GB)."""
    tracemalloc.start()
    try:
        alloc = SlotAllocator(10**8)
        taken = alloc.allocate_many(1000)
        used = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert taken == list(range(1000)) and alloc.num_free == 10**8 - 1000
    assert used < 200_000


def test_slot_allocator_reuses_the_last_freed_first() -> None:
    alloc = SlotAllocator(6)
    assert alloc.allocate_many(3) == [0, 1, 2]
    alloc.free(1)
    alloc.free_many([0, 2])
    assert alloc.allocate() == 2
    assert alloc.allocate_many(4) == [0, 1, 3, 4]
    assert alloc.num_free == 1 and alloc.free_slots() == [5]


def test_host_slab_beyond_memory_is_refused_before_allocating() -> None:
    with pytest.raises(ValueError, match=r"host slab \(1048576 slots of 1073741824 bytes\) of "
                                         r"1048576\.0 GiB is more than this machine.s memory"):
        HostSlab(2**20, 2**30, pin_memory=False)
