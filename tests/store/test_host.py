"""The host-memory tier: slot sizes from the layout, zero-copy views, a store over it."""

from __future__ import annotations

import numpy as np
import pytest
from store_helpers import keys, store_ok

from kvtier.layout import Group, Layout
from kvtier.store import SlotBackend, ZeroCopyBackend
from kvtier.tiers.host import HostSlab, cuda_available, host_store, slots_for_capacity

LAYOUT = Layout(
    (
        Group("full", 16, bytes_per_token=64),  # 1024-byte chunks
        Group("sliding_window", 4, window=8, bytes_per_token=32),  # 128-byte chunks
    )
)


def test_slot_size_is_the_largest_chunk_and_capacity_rounds_down() -> None:
    slab = HostSlab.for_layout(LAYOUT, capacity_bytes=3 * 1024 + 1000, pin_memory=False)
    assert (slab.num_slots, slab.slot_bytes, slab.nbytes) == (3, 1024, 3072)
    assert isinstance(slab, SlotBackend) and isinstance(slab, ZeroCopyBackend)


def test_views_are_zero_copy_and_disjoint() -> None:
    slab = HostSlab(3, 16, pin_memory=False)
    view = slab.view(1)
    assert view.dtype == np.uint8 and view.shape == (16,) and view.flags.writeable
    view[:] = 9
    assert slab.read(1) == bytes([9]) * 16
    assert slab.read(0) == bytes(16) and slab.read(2) == bytes(16)
    slab.write(2, b"xyz")
    assert slab.view(2)[:3].tobytes() == b"xyz" and slab.read(2, 3) == b"xyz"


def test_rows_are_every_slot_at_once_without_a_copy() -> None:
    slab = HostSlab(3, 16, pin_memory=False)
    rows = slab.rows()
    assert rows.shape == (3, 16) and rows.dtype == np.uint8 and rows.flags.writeable
    rows[1, :4] = 7
    slab.write(2, b"ab")
    assert slab.read(1, 5) == bytes([7, 7, 7, 7, 0]) and bytes(rows[2, :2]) == b"ab"
    assert slab.read(0) == bytes(16)


def test_tensor_view_shares_memory() -> None:
    torch = pytest.importorskip("torch")
    slab = HostSlab(2, 8, pin_memory=False)
    t = slab.tensor(1)
    assert t.dtype == torch.uint8 and t.numel() == 8
    t.fill_(5)
    assert slab.read(1) == bytes([5]) * 8


def test_store_handles_name_slots_of_the_slab() -> None:
    store = host_store(LAYOUT, capacity_bytes=2 * 1024, pin_memory=False)
    assert store.num_slots == 2 and isinstance(store.backend, HostSlab)
    handle = store.prepare_store(keys("a"))
    assert not isinstance(handle, type(None))
    store.backend.write(handle.slots[0], b"chunk-a")  # type: ignore[union-attr]
    store.complete_store(handle, ok=True)  # type: ignore[arg-type]
    load = store.prepare_load(keys("a"))
    assert store.backend.read(load.slots[0], 7) == b"chunk-a"
    store.complete_load(load)
    store_ok(store, keys("bc"))  # evicts a: its slot is reused
    store.check_invariants()


def test_capacity_smaller_than_one_slot_is_refused() -> None:
    with pytest.raises(ValueError, match=r"smaller than one slot \(1024 bytes"):
        HostSlab.for_layout(LAYOUT, capacity_bytes=1000)
    with pytest.raises(ValueError, match="smaller than one slot"):
        host_store(LAYOUT, capacity_bytes=1023)
    assert slots_for_capacity(1024, 1024) == 1


def test_bad_slab_arguments() -> None:
    with pytest.raises(ValueError, match="gives no chunk sizes"):
        HostSlab.for_layout(Layout((Group("full", 16),)), 1 << 20)
    with pytest.raises(ValueError, match="num_slots must be a positive integer"):
        HostSlab(0, 16, pin_memory=False)
    slab = HostSlab(2, 4, pin_memory=False)
    with pytest.raises(ValueError, match=r"slot must be an int in \[0, 2\)"):
        slab.view(2)
    with pytest.raises(ValueError, match="do not fit in a 4-byte slot"):
        slab.write(0, b"12345")


@pytest.mark.skipif(cuda_available(), reason="checks the CPU-only refusal")
def test_pinning_without_cuda_is_refused() -> None:
    assert HostSlab(1, 8).pinned is False
    with pytest.raises(ValueError, match="needs torch and a CUDA device"):
        HostSlab(1, 8, pin_memory=True)


@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_slab_is_pinned_when_cuda_is_present() -> None:
    slab = HostSlab(2, 64)
    assert slab.pinned and slab.tensor(0).is_pinned()
    slab.view(1)[:] = 3
    assert slab.tensor(1).cuda().cpu().tolist() == [3] * 64
