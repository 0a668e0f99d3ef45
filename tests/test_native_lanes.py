"""``kvtier._native.copy_lanes`` (one transfer batch per call, its byte ranges computed from
the batch's blocks) and ``sorted_blocks`` (those blocks, in the order it takes them), against
the Python they stand for. Skipped in the pure build, as tests/test_native.py."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

_native = pytest.importorskip("kvtier._native", reason="built only by KVTIER_COMPILE=1")

FIELDS = 6  # kv_base, kv_step, slot_base, slot_step, length, positions


@pytest.mark.parametrize(("n", "bound"), [(0, 5), (1, 1), (40, 50), (40, 10_000), (500, 64)])
def test_sorted_blocks_are_a_stable_sort_with_slot_and_position(n: int, bound: int) -> None:
    """Dense ids (a counting sort) and sparse ones (a merge sort), repeats included: each
    block's id, its copy's slot address and its position, by id."""
    copies = 5 if n % 5 == 0 else 1
    rng = np.random.default_rng(n + bound)
    ids = rng.integers(0, bound, n).astype(np.int64)
    ptrs = rng.integers(0, 2**40, copies).astype(np.int64)
    got = np.frombuffer(_native.sorted_blocks(ids, ptrs, bound), np.int64).reshape(-1, 3)
    order = np.argsort(ids, kind="stable")
    want = np.stack([ids[order], ptrs[order % copies], order // copies], axis=1)
    np.testing.assert_array_equal(got, want.reshape(-1, 3))


def test_sorted_blocks_refuses_ids_outside_the_bound_or_a_ragged_batch() -> None:
    ptrs = np.zeros(1, np.int64)
    for bad in ([3, 10], [-1, 2]):
        with pytest.raises(ValueError, match="outside"):
            _native.sorted_blocks(np.array(bad, np.int64), ptrs, 10)
    with pytest.raises(ValueError, match="blocks x copies"):
        _native.sorted_blocks(np.arange(3, dtype=np.int64), np.zeros(2, np.int64), 10)
    with pytest.raises(ValueError, match="blocks x copies"):
        _native.sorted_blocks(np.arange(3, dtype=np.int64), np.zeros(0, np.int64), 10)


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

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        ids = self.ids.reshape(-1)
        ptrs = int(self.slots.ctypes.data) + np.arange(len(self.slots), dtype=np.int64) \
            * self.slots.shape[1]
        blocks = np.frombuffer(_native.sorted_blocks(ids, ptrs, self.num_blocks), np.int64)
        return blocks, self.table.reshape(-1)

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
                         [(1, 1, 1, 8), (5, 4, 3, 256), (17, 3, 2, 1000), (64, 4, 4, 1024),
                          (700, 4, 2, 64),  # 5,600 ranges: several tables of ranges
                          (9, 3, 2, 4100), (3, 2, 1, 70_000)])  # long ranges: the walk
def test_copy_lanes_moves_what_block_copies_move(to_kv: bool, copies: int, blocks: int,
                                                 lanes: int, width: int) -> None:
    batch = Batch(copies, blocks, lanes, width, 2 * copies * blocks + 3, seed=copies * width)
    want_kv, want_slots = batch.expected(to_kv)
    _native.copy_lanes(to_kv, *batch.arrays())
    np.testing.assert_array_equal(batch.kv, want_kv)  # and not one byte elsewhere
    np.testing.assert_array_equal(batch.slots, want_slots)


@pytest.mark.parametrize("width", [300, 1500], ids=["by-tables", "by-the-walk"])
@pytest.mark.parametrize("to_kv", [False, True])
def test_a_run_lane_moves_each_copys_blocks_as_one_range(to_kv: bool, width: int) -> None:
    batch = Batch(6, 4, 1, width, 40, seed=3, run_lane=True)  # ranges of 4 x width bytes
    want_kv, want_slots = batch.expected(to_kv)
    _native.copy_lanes(to_kv, *batch.arrays())
    np.testing.assert_array_equal(batch.kv, want_kv)
    np.testing.assert_array_equal(batch.slots, want_slots)


@pytest.mark.parametrize("width", [512, 4096], ids=["by-tables", "by-the-walk"])
@pytest.mark.parametrize("grain", [1, 5, 10_000])
@pytest.mark.parametrize("threads", [2, 4])
def test_threads_sharing_a_cursor_move_every_block_once(threads: int, grain: int,
                                                        width: int) -> None:
    batch = Batch(40, 4, 3, width, 200, seed=threads + grain)
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
    blocks, lanes = Batch(4, 2, 2, 64, 20, seed=1).arrays()  # 8 blocks
    field = np.arange(len(lanes)) % FIELDS
    for args, says in [
        ((blocks[:-1], lanes), "3 int64 fields per block"),
        ((blocks, lanes[:-1]), "6 int64 fields per lane"),
        ((np.where(np.arange(len(blocks)) % 3 == 2, -1, blocks), lanes), "negative id or "
         "position"),
        ((blocks, np.where(field == 5, -1, lanes)), "negative length or positions"),
        ((blocks, np.where(field == 4, -1, lanes)), "negative length"),
        ((blocks.astype(np.int32), lanes), "8-byte integers"),
    ]:
        with pytest.raises(ValueError, match=says):
            _native.copy_lanes(True, *args)
    with pytest.raises(ValueError, match="grain must be at least 1"):
        _native.copy_lanes(True, blocks, lanes, np.zeros(1, np.int64), 0)
    with pytest.raises(ValueError, match="cursor must be one aligned"):
        _native.copy_lanes(True, blocks, lanes, np.zeros(2, np.int64), 1)


def _read(copies: list, num_blocks: tuple[int, ...] = (2**41,) * 3,
          per_slot: tuple[int, ...] = (4,) * 3, rows: int = 0, load: bool = False) -> tuple:
    from kvtier.transfer import ChunkCopy

    return _native.read_job(copies, ChunkCopy, np.array(num_blocks, np.int64),
                            np.array(per_slot, np.int64), rows, 1000, 100, load)


def test_read_job_reads_what_python_reads() -> None:
    """Every copy's group, first block, block count, slot row, whether its ids are
    consecutive, and its block ids, as int64, and the slots themselves; the slots flagged
    as not all rows when one is a buffer, negative or past int64 (its entry 0); None where
    a copy is not a ChunkCopy or a field is not a ChunkCopy's (a numpy group: Python then
    reads it). A subclass's copies (fields read by getattr) read the same."""
    from kvtier.transfer import ChunkCopy

    class Named(ChunkCopy):
        __slots__ = ()

    buffer = np.zeros(8, np.uint8)
    for kind in (ChunkCopy, Named):
        copies = [kind(1, 7, (5, 2, 9)), kind(0, 3, (4,), first_block=2),
                  kind(2, 2**40, (2**40, 2**40 + 1))]
        table, ints, slots, bad, _, _ = _read(copies)
        np.testing.assert_array_equal(np.frombuffer(table, np.int64), [
            1, 0, 2, 0, 2, 0, 3, 1, 2, 7, 3, 2**40, 0, 1, 1, 5, 2, 9, 4, 2**40, 2**40 + 1])
        assert ints and slots == [7, 3, 2**40] and bad == -1
        for odd in (buffer, 2**70, -1):
            table, ints, slots, *_ = _read([*copies, kind(0, odd, (1,))])
            assert not ints and np.frombuffer(table, np.int64)[3 * 4 + 3] == 0
            assert slots[3] is odd
    weird = ChunkCopy(0, 1, (1,))
    object.__setattr__(weird, "group", np.int64(0))
    assert _read([weird]) is None
    object.__setattr__(weird, "group", 0)
    object.__setattr__(weird, "block_ids", [1])  # not a tuple
    assert _read([weird]) is None
    assert _read([object()]) is None
    table, ints, slots, bad, batch, _ = _read([])
    assert len(table) == 0 and ints and slots == [] and bad == -1 and batch is None


def test_read_job_checks_what_the_plan_checks() -> None:
    """bad: the first copy whose group, chunk positions or block ids are out of range;
    repeated: an engine block loaded twice (per group) or a slab row stored twice, -1 where
    not known; one batch (ids by position, then slot addresses) where the copies share a
    group, shape and run flag, name ascending slab rows and pass every check."""
    from kvtier.transfer import ChunkCopy

    def facts(copies: list, rows: int = 8, load: bool = False) -> tuple:
        bad, batch, repeated = _read(copies, (10, 6), (4, 1), rows, load)[3:]
        return bad, None if batch is None else np.frombuffer(batch, np.int64).tolist(), repeated

    good = [ChunkCopy(0, 1, (3, 9)), ChunkCopy(0, 2, (7, 1)), ChunkCopy(0, 2, (4, 5))]
    assert facts(good) == (-1, None, 1)  # row 2 twice: the caller checks the bytes
    assert facts(good, load=True) == (-1, None, 0)
    assert facts(good[:2], load=True) == (-1, [3, 7, 9, 1, 1100, 1200], 0)
    assert facts([*good[:2], ChunkCopy(0, 3, (1, 8))], load=True) == (-1, None, 1)
    assert facts([*good[:2], ChunkCopy(1, 3, (5,))], load=True) == (-1, None, 0)
    for bad in (ChunkCopy(2, 3, (1,)), ChunkCopy(0, 3, (10,)), ChunkCopy(1, 3, (6,)),
                ChunkCopy(0, 3, (1, 2), first_block=3), ChunkCopy(1, 3, (1,), first_block=1)):
        assert facts([*good, bad, ChunkCopy(0, 2, (99,))]) == (3, None, -1)
    assert facts(good[:2], rows=2) == (-1, None, -1)  # row 2 outside: slot_addresses says so
    assert facts([ChunkCopy(0, 2, (1,)), ChunkCopy(0, 1, (2,))]) == (-1, None, 0)
    assert facts([ChunkCopy(0, 1, (1,)), ChunkCopy(0, np.zeros(8, np.uint8), (2,))]) \
        == (-1, None, -1)
    assert facts([ChunkCopy(0, 1, (1, 2)), ChunkCopy(0, 2, (4, 5))]) \
        == (-1, [1, 4, 2, 5, 1100, 1200], 0)
