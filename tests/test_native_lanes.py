"""``kvtier._native.copy_lanes`` (one transfer batch per call, its byte ranges computed from
engine block ids) and ``block_order`` (the order it takes the blocks in), against the
Python they stand for. Skipped in the pure build, as tests/test_native.py."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

_native = pytest.importorskip("kvtier._native", reason="built only by KVTIER_COMPILE=1")

FIELDS = 6  # kv_base, kv_step, slot_base, slot_step, length, positions


@pytest.mark.parametrize(("n", "bound"), [(0, 5), (1, 1), (40, 50), (40, 10_000), (500, 64)])
def test_block_order_is_a_stable_sort(n: int, bound: int) -> None:
    """Dense ids (a counting sort) and sparse ones (a merge sort), repeats included."""
    ids = np.random.default_rng(n + bound).integers(0, bound, n).astype(np.int64)
    got = np.frombuffer(_native.block_order(ids, bound), np.int64)
    np.testing.assert_array_equal(got, np.argsort(ids, kind="stable"))


def test_block_order_refuses_ids_outside_the_bound() -> None:
    for bad in ([3, 10], [-1, 2]):
        with pytest.raises(ValueError, match="outside"):
            _native.block_order(np.array(bad, np.int64), 10)


class Batch:
    """``copies`` copies of ``blocks`` blocks each out of a KV buffer of ``num_blocks`` rows
    of ``lanes`` pieces of ``width`` bytes; a copy's slot holds lane ``l``'s blocks at
    ``l * blocks * width``, block after block. Example: 2 lanes, 3 blocks, width 4: a slot
    of 24 bytes, lane 1's block 2 at byte 20."""

    def __init__(self, copies: int, blocks: int, lanes: int, width: int, num_blocks: int,
                 seed: int, run_lane: bool = False) -> None:
        rng = np.random.default_rng(seed)
        self.blocks, self.width, self.nlanes, self.num_blocks = blocks, width, lanes, num_blocks
        self.kv = rng.integers(0, 256, num_blocks * lanes * width, dtype=np.uint8)
        self.slots = rng.integers(0, 256, (copies, lanes * blocks * width), dtype=np.uint8)
        ids = rng.permutation(num_blocks)[: copies * blocks].reshape(blocks, copies)
        if run_lane:  # every copy's blocks consecutive: lane 0 moves them as one range
            ids = (rng.permutation(num_blocks // blocks)[:copies] * blocks)[None, :] \
                + np.arange(blocks)[:, None]
        self.ids = np.ascontiguousarray(ids, np.int64)
        self.run_lane = run_lane
        row = lanes * width
        base = int(self.kv.ctypes.data)
        self.table = np.array([
            (base + lane * width, row, lane * blocks * width, width, width, blocks)
            for lane in range(lanes)], np.int64)
        if run_lane:  # a one-piece layer of a consecutive batch: lanes == 1, rows contiguous
            self.table[0] = (base, row, 0, 0, blocks * width, 1)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        ids = self.ids.reshape(-1)
        ptrs = int(self.slots.ctypes.data) + np.arange(len(self.slots), dtype=np.int64) \
            * self.slots.shape[1]
        order = np.frombuffer(_native.block_order(ids, self.num_blocks), np.int64)
        return ids, ptrs, order, self.table.reshape(-1)

    def expected(self, to_kv: bool) -> tuple[np.ndarray, np.ndarray]:
        """The KV buffer and slots after the batch, moved one block at a time in Python."""
        kv, slots, w = self.kv.copy(), self.slots.copy(), self.width
        rows = kv.reshape(-1, self.nlanes * w)
        for c in range(len(slots)):
            for j in range(self.blocks):
                for lane in range(self.nlanes):
                    at = (lane * self.blocks + j) * w
                    kv_part = rows[self.ids[j, c], lane * w : (lane + 1) * w]
                    if to_kv:
                        kv_part[:] = slots[c, at : at + w]
                    else:
                        slots[c, at : at + w] = kv_part
        return kv, slots


@pytest.mark.parametrize("to_kv", [False, True])
@pytest.mark.parametrize(("copies", "blocks", "lanes", "width"),
                         [(1, 1, 1, 8), (5, 4, 3, 256), (17, 3, 2, 1000), (64, 4, 4, 1024)])
def test_copy_lanes_moves_what_block_copies_move(to_kv: bool, copies: int, blocks: int,
                                                 lanes: int, width: int) -> None:
    batch = Batch(copies, blocks, lanes, width, 2 * copies * blocks + 3, seed=copies * width)
    want_kv, want_slots = batch.expected(to_kv)
    _native.copy_lanes(to_kv, *batch.arrays())
    np.testing.assert_array_equal(batch.kv, want_kv)  # and not one byte elsewhere
    np.testing.assert_array_equal(batch.slots, want_slots)


@pytest.mark.parametrize("to_kv", [False, True])
def test_a_run_lane_moves_each_copys_blocks_as_one_range(to_kv: bool) -> None:
    batch = Batch(6, 4, 1, 300, 40, seed=3, run_lane=True)
    want_kv, want_slots = batch.expected(to_kv)
    _native.copy_lanes(to_kv, *batch.arrays())
    np.testing.assert_array_equal(batch.kv, want_kv)
    np.testing.assert_array_equal(batch.slots, want_slots)


@pytest.mark.parametrize("grain", [1, 5, 10_000])
@pytest.mark.parametrize("threads", [2, 4])
def test_threads_sharing_a_cursor_move_every_block_once(threads: int, grain: int) -> None:
    batch = Batch(40, 4, 3, 512, 200, seed=threads + grain)
    want_kv, want_slots = batch.expected(False)
    cursor = np.zeros(1, np.int64)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        jobs = [pool.submit(_native.copy_lanes, False, *batch.arrays(), cursor, grain)
                for _ in range(threads)]
        for job in jobs:
            job.result()
    np.testing.assert_array_equal(batch.slots, want_slots)
    np.testing.assert_array_equal(batch.kv, want_kv)
    items = 3 * 40 * 4
    step = min(grain, items)
    assert int(cursor[0]) == (-(-items // step) + threads) * step


def test_bad_copy_lanes_arguments_are_clear_errors() -> None:
    ids, ptrs, order, lanes = Batch(4, 2, 2, 64, 20, seed=1).arrays()  # 8 ids
    for args, says in [
        ((ids, ptrs, order[:-1], lanes), "order and ids differ in length"),
        ((ids, ptrs, order, lanes[:-1]), "6 int64 fields per lane"),
        ((ids, ptrs[:3], order, lanes), "blocks x copies"),  # 8 ids over 3 copies
        ((ids, ptrs[:0], order, lanes), "blocks x copies"),
        ((ids, ptrs, np.full_like(order, len(order)), lanes), "order must index ids"),
        ((ids, ptrs, order, np.where(np.arange(len(lanes)) % FIELDS == 5, 3, lanes)),
         "more positions than blocks"),
        ((ids, ptrs, order, np.where(np.arange(len(lanes)) % FIELDS == 4, -1, lanes)),
         "negative length"),
        ((ids.astype(np.int32), ptrs, order, lanes), "8-byte integers"),
    ]:
        with pytest.raises(ValueError, match=says):
            _native.copy_lanes(True, *args)
    with pytest.raises(ValueError, match="grain must be at least 1"):
        _native.copy_lanes(True, ids, ptrs, order, lanes, np.zeros(1, np.int64), 0)
    with pytest.raises(ValueError, match="cursor must be one aligned"):
        _native.copy_lanes(True, ids, ptrs, order, lanes, np.zeros(2, np.int64), 1)
