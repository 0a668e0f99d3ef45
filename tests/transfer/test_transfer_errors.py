"""Bad registrations and bad copies fail early, with messages that say what to fix."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from transfer_helpers import kv_shape

from kvtier.layout import Group, Layout
from kvtier.transfer import ChunkCopy, GroupKV, TransferEngine, allocate_slab

FULL = Group("full", tokens_per_block=4, blocks_per_chunk=2, bytes_per_token=2 * (2 * 2 * 8 * 2))
STATE = Group("state", tokens_per_block=4, blocks_per_chunk=2, bytes_per_state=64)
LAYOUT = Layout((FULL, STATE))


def layer(num_blocks: int = 10, tokens: int = 4, axis: int = 0,
          dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.zeros(kv_shape(axis, num_blocks, tokens), dtype=dtype)


def state_layer(num_blocks: int = 10) -> torch.Tensor:
    return torch.zeros((num_blocks, 16), dtype=torch.float16)


def good_kv() -> list[GroupKV]:
    return [GroupKV((layer(), layer())), GroupKV((state_layer(), state_layer()))]


BAD_REGISTRATIONS: dict[str, tuple[Callable[[], list[GroupKV]], str]] = {
    "too few groups": (lambda: good_kv()[:1], "layout has 2 groups but 1 GroupKV"),
    "num_blocks differ": (
        lambda: [GroupKV((layer(10), layer(12))), good_kv()[1]],
        r"different num_blocks \[10, 12\]"),
    "block size": (
        lambda: [GroupKV((layer(tokens=8), layer(tokens=8))), good_kv()[1]],
        "8 tokens per block at axis 2 .* tokens_per_block=4"),
    "bytes per token": (
        lambda: [GroupKV((layer(dtype=torch.float32), layer())), good_kv()[1]],
        "bytes per token .* bytes_per_token=128"),
    "one layer too few": (lambda: [GroupKV((layer(),)), good_kv()[1]], "bytes_per_token=128"),
    "bytes per state": (
        lambda: [good_kv()[0], GroupKV((state_layer(),))], "bytes_per_state=64"),
    "non-contiguous": (
        lambda: [GroupKV((layer(), layer(axis=1).transpose(0, 1))), good_kv()[1]],
        "layer 1 is not contiguous"),
    "too few dims": (
        lambda: [good_kv()[0], GroupKV((torch.zeros(10, 16),) * 2, block_axis=1)],
        "block axis 1 needs at least 3 dimensions"),
    "empty group": (lambda: [GroupKV(()), good_kv()[1]], "at least one layer"),
    "not a tensor": (
        lambda: [GroupKV((np.zeros((10, 2, 4, 2, 8)),) * 2), good_kv()[1]],  # type: ignore[arg-type]
        "must be torch tensors"),
}


@pytest.mark.parametrize("case", list(BAD_REGISTRATIONS))
def test_bad_registration_is_refused(case: str) -> None:
    build, message = BAD_REGISTRATIONS[case]
    with pytest.raises(ValueError, match=message):
        TransferEngine(LAYOUT, build())


def test_block_axis_must_be_zero_or_one() -> None:
    with pytest.raises(ValueError, match="block_axis must be 0 or 1"):
        GroupKV((layer(),), block_axis=2)  # type: ignore[arg-type]


def test_load_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="load_threads must be at least 1, got 0"):
        TransferEngine(LAYOUT, good_kv(), load_threads=0)


def test_both_block_axes_register_for_one_layout() -> None:
    TransferEngine(LAYOUT, [GroupKV((layer(axis=1), layer(axis=1)), block_axis=1), good_kv()[1]])


@pytest.fixture
def engine() -> Iterator[TransferEngine]:
    with TransferEngine(LAYOUT, good_kv()) as eng:
        yield eng


SLAB = allocate_slab(4, 1024, "cpu")

BAD_COPIES: dict[str, tuple[Callable[[], list[ChunkCopy]], str]] = {
    "group out of range": (lambda: [ChunkCopy(2, SLAB[0], (1,))], "group 2 is not in the layout"),
    "block id out of range": (lambda: [ChunkCopy(0, SLAB[0], (1, 10))], "block id 10"),
    "past the chunk": (
        lambda: [ChunkCopy(0, SLAB[0], (1, 2), first_block=1)], "blocks 1..2 are outside"),
    "two states": (lambda: [ChunkCopy(1, SLAB[0], (1, 2))], "a state chunk holds one"),
    "small slot": (lambda: [ChunkCopy(0, SLAB[0, :100], (1, 2))], "holds 100 bytes .* needs 1024"),
    "int slot": (lambda: [ChunkCopy(0, torch.zeros(1024, dtype=torch.int32), (1,))],
                 "1-D contiguous uint8"),
    "2-D slot": (lambda: [ChunkCopy(0, SLAB[:2], (1,))], "1-D contiguous uint8"),
    "strided slot": (lambda: [ChunkCopy(0, SLAB[:, 0], (1,))], "1-D contiguous uint8"),
    "read-only numpy": (lambda: [ChunkCopy(0, _read_only(), (1,))], "read-only"),
    "list slot": (lambda: [ChunkCopy(0, [0] * 1024, (1,))], "torch tensor or numpy"),  # type: ignore[arg-type]
    "row index, no slab": (lambda: [ChunkCopy(0, 3, (1,))], "no slab is registered"),
}


def _read_only() -> np.ndarray:
    a = np.zeros(1024, dtype=np.uint8)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("direction", ["store", "load"])
@pytest.mark.parametrize("case", list(BAD_COPIES))
def test_bad_copy_is_refused_at_submit(engine: TransferEngine, direction: str, case: str) -> None:
    build, message = BAD_COPIES[case]
    submit = engine.submit_store if direction == "store" else engine.submit_load
    with pytest.raises(ValueError, match=message):
        submit(build())
    assert engine.poll() == []


def test_copy_itself_checks_its_numbers() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        ChunkCopy(0, SLAB[0], ())
    with pytest.raises(ValueError, match="must be >= 0"):
        ChunkCopy(0, SLAB[0], (-1,))
    with pytest.raises(ValueError, match="first_block must be >= 0"):
        ChunkCopy(0, SLAB[0], (1,), first_block=-1)


def test_a_store_cannot_write_one_slot_twice(engine: TransferEngine) -> None:
    with pytest.raises(ValueError, match="copies 0 and 1 write overlapping slot bytes"):
        engine.submit_store([ChunkCopy(0, SLAB[0], (1, 2)), ChunkCopy(0, SLAB[0], (3,))])
    engine.wait(engine.submit_store([
        ChunkCopy(0, SLAB[0], (1,)), ChunkCopy(0, SLAB[0], (3,), first_block=1)]))


def test_a_load_cannot_write_one_block_twice(engine: TransferEngine) -> None:
    with pytest.raises(ValueError, match="engine block 2 of group 0 is written twice"):
        engine.submit_load([ChunkCopy(0, SLAB[0], (1, 2)), ChunkCopy(0, SLAB[1], (2, 3))])
    assert engine.wait(engine.submit_load([
        ChunkCopy(0, SLAB[0], (1, 2)), ChunkCopy(1, SLAB[1], (2,))])).ok


def test_copy_for_run_checks_the_block_table(engine: TransferEngine) -> None:
    from kvtier.coverage import BlockRun

    with pytest.raises(ValueError, match="block_table has 3 entries"):
        engine.copy_for_run(0, SLAB[0], BlockRun(1, 0, 2), [0, 1, 2])
    with pytest.raises(ValueError, match="holds only its last block"):
        engine.copy_for_run(1, SLAB[0], BlockRun(0, 0, 1), [0, 1, 2])


ROWS = allocate_slab(4, 1024, "cpu")


@pytest.fixture
def slab_engine() -> Iterator[TransferEngine]:
    with TransferEngine(LAYOUT, good_kv(), slab=ROWS) as eng:
        yield eng


@pytest.mark.parametrize("direction", ["store", "load"])
@pytest.mark.parametrize(("slots", "bad"), [
    ([0, 4], "4"), ([-1], "-1"), ([1, SLAB[0], 9], "9"), ([2, 2**70], str(2**70)),
    ([-(2**70)], str(-(2**70))), ([np.uint64(2**63 + 5)], str(2**63 + 5))],
    ids=["past-the-end", "negative", "mixed-with-a-buffer", "past-int64", "below-int64",
         "uint64"])
def test_a_row_index_outside_the_registered_slab_is_refused(
        slab_engine: TransferEngine, direction: str, slots: list, bad: str) -> None:
    submit = slab_engine.submit_store if direction == "store" else slab_engine.submit_load
    copies = [ChunkCopy(0, s, (i,)) for i, s in enumerate(slots)]
    with pytest.raises(ValueError, match=rf"slot {bad} is not a row of the registered slab "
                                         r"\(it has 4 rows\)"):
        submit(copies)
    assert slab_engine.poll() == []


def test_a_store_cannot_write_one_slab_row_twice(slab_engine: TransferEngine) -> None:
    with pytest.raises(ValueError, match="copies 0 and 2 write overlapping slot bytes"):
        slab_engine.submit_store([ChunkCopy(0, 1, (1, 2)), ChunkCopy(0, 2, (4,)),
                                  ChunkCopy(0, np.int64(1), (3,))])
    with pytest.raises(ValueError, match="copies 0 and 1 write overlapping slot bytes"):
        slab_engine.submit_store([ChunkCopy(0, 1, (1, 2)), ChunkCopy(0, ROWS[1], (3,))])
    assert slab_engine.wait(slab_engine.submit_store([
        ChunkCopy(0, 1, (1,)), ChunkCopy(0, 1, (3,), first_block=1)])).ok


def test_a_slot_index_is_an_integer_not_a_bool() -> None:
    with pytest.raises(ValueError, match="slot must be a buffer or a slab row index, got a bool"):
        ChunkCopy(0, np.bool_(True), (1,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got a bool"):
        ChunkCopy(0, False, (1,))
    assert ChunkCopy(0, np.int32(3), (1,)).slot == 3
    assert type(ChunkCopy(0, np.int64(3), (1,)).slot) is int


def _read_only_rows() -> np.ndarray:
    a = np.zeros((4, 1024), dtype=np.uint8)
    a.flags.writeable = False
    return a


BAD_SLABS: dict[str, tuple[Callable[[], object], str]] = {
    "1-D": (lambda: torch.zeros(4096, dtype=torch.uint8), "2-D contiguous uint8"),
    "not uint8": (lambda: torch.zeros((4, 1024), dtype=torch.int32), "2-D contiguous uint8"),
    "strided rows": (lambda: torch.zeros((1024, 4), dtype=torch.uint8).T, "2-D contiguous uint8"),
    "rows too short": (lambda: allocate_slab(4, 1000, "cpu"), "rows of 1000 bytes cannot hold "
                       r"the largest chunk \(1024 bytes\)"),
    "no rows": (lambda: torch.zeros((0, 1024), dtype=torch.uint8), "cannot hold"),
    "read-only numpy": (_read_only_rows, "read-only"),
    "numpy of floats": (lambda: np.zeros((4, 1024)), "2-D contiguous uint8, got float64"),
    "a list": (lambda: [[0] * 1024] * 4, "torch tensor or numpy array, got list"),
}


@pytest.mark.parametrize("case", list(BAD_SLABS))
def test_a_bad_slab_is_refused_at_registration(case: str) -> None:
    build, message = BAD_SLABS[case]
    with pytest.raises(ValueError, match=message):
        TransferEngine(LAYOUT, good_kv(), slab=build())  # type: ignore[arg-type]
