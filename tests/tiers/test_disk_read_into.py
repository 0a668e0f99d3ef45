"""A disk promotion reads each record straight into its host slot (``DiskTier.get_into``):
the same records found, the same verified bytes and the same verdicts as ``get`` for every
damaged or foreign file, only without a buffer per record and a second copy."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tier_helpers import GEOMETRY, SLOT, items, key, payload

from kvtier.keys import ChunkKey
from kvtier.tiers.disk.directory import record_path
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.records.format import HEADER_BYTES
from kvtier.tiers.records.seal import MacSeal, Secret

NAMES = ["a", "b", "c", "d"]
VICTIM = key("b")


def _truncate(p: Path) -> None:
    os.truncate(p, p.stat().st_size - 1)


def _pad(p: Path) -> None:
    with open(p, "ab") as f:
        f.write(b"\0")


def _flip_payload(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[HEADER_BYTES + 7] ^= 0x01
    p.write_bytes(bytes(data))


def _flip_header(p: Path) -> None:  # not a record any more: foreign, left alone
    data = bytearray(p.read_bytes())
    data[0] ^= 0xFF
    p.write_bytes(bytes(data))


def _header_only(p: Path) -> None:
    os.truncate(p, HEADER_BYTES)


def _short(p: Path) -> None:  # shorter than a header
    os.truncate(p, HEADER_BYTES // 2)


def _symlink(p: Path) -> None:  # to another record: never followed
    p.unlink()
    p.symlink_to(record_path(p.parent.parent, key("a")))


def _other_key(p: Path) -> None:  # a whole record of another key under this name
    p.write_bytes(record_path(p.parent.parent, key("c")).read_bytes())


DAMAGE: dict[str, Callable[[Path], None]] = {
    "intact": lambda p: None, "truncated": _truncate, "padded": _pad,
    "payload bit": _flip_payload, "header byte": _flip_header, "header only": _header_only,
    "short": _short, "symlink": _symlink, "another key's record": _other_key,
}


def _tier(root: Path, seal: MacSeal | None = None) -> DiskTier:
    return DiskTier(root, 16 * (HEADER_BYTES + SLOT), SLOT, geometry=GEOMETRY, fsync=False,
                    seal=seal)


def _outcome(root: Path, damage: Callable[[Path], None], into: bool,
             seal: MacSeal | None = None) -> tuple[dict[ChunkKey, bytes], tuple[int, ...],
                                                   list[str], np.ndarray]:
    """Records written, one damaged, then read by ``get`` or ``get_into``: the payloads,
    the tier's verdict counters, what is left on disk and the slots' bytes."""
    tier = _tier(root, seal)
    tier.put(items(NAMES))
    damage(record_path(root, VICTIM))
    slots = np.full((len(NAMES), SLOT + 8), 0xEE, dtype=np.uint8)
    keys = [key(n) for n in NAMES]
    try:
        if into:
            got = tier.get_into(keys, [memoryview(row.data) for row in slots])
        else:
            got = tier.get(keys)
        s = tier.stats
        verdicts = (s.hits, s.misses, s.corrupt, s.foreign, s.errors, s.bytes_read)
        payloads = {k: bytes(v) for k, v in got.items()}
        left = sorted(p.name for p in (root / "chunks").iterdir())
        return payloads, verdicts, left, slots
    finally:
        tier.close()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_get_into_finds_what_get_finds_and_refuses_what_it_refuses(
    tmp_path: Path, damage: str
) -> None:
    got, verdicts, left, _ = _outcome(tmp_path / "get", DAMAGE[damage], into=False)
    got_into, verdicts_into, left_into, slots = _outcome(tmp_path / "into", DAMAGE[damage],
                                                         into=True)
    assert got_into == got and verdicts_into == verdicts and left_into == left
    expected = dict(items(NAMES))
    for i, name in enumerate(NAMES):
        k = key(name)
        if k in got_into:  # verified bytes, in the slot itself, nothing past the payload
            assert got_into[k] == expected[k]
            assert bytes(slots[i, :SLOT]) == expected[k]
            assert bytes(slots[i, SLOT:]) == b"\xee" * 8
    # the negative control: only the intact file is served; each damage costs its record
    assert (VICTIM in got_into) == (damage == "intact")
    assert len(got_into) == len(NAMES) - (damage != "intact")


def test_the_payloads_returned_are_the_slots_memory(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    tier.put(items(["a"]))
    slot = np.zeros(SLOT, dtype=np.uint8)
    got = tier.get_into([key("a")], [memoryview(slot.data)])
    slot[0] ^= 0xFF  # a write to the slot shows through the payload: no copy was made
    assert got[key("a")][0] == slot[0]
    tier.close()


def test_a_sealed_tier_reads_as_get_and_copies_into_the_slots(tmp_path: Path) -> None:
    seal = MacSeal(Secret(b"k" * 32, "test"))
    got, verdicts, _, _ = _outcome(tmp_path / "get", _flip_payload, into=False, seal=seal)
    got_into, verdicts_into, _, slots = _outcome(tmp_path / "into", _flip_payload, into=True,
                                                 seal=seal)
    assert got_into == got and verdicts_into == verdicts and VICTIM not in got_into
    assert bytes(slots[0, :SLOT]) == dict(items(NAMES))[key("a")]


@pytest.mark.parametrize("views", ["too few", "too small"])
def test_views_that_cannot_hold_the_payloads_are_refused(tmp_path: Path, views: str) -> None:
    tier = _tier(tmp_path)
    tier.put(items(["a", "b"]))
    keys = [key("a"), key("b")]
    bufs = ([memoryview(bytearray(SLOT))] if views == "too few"
            else [memoryview(bytearray(SLOT)), memoryview(bytearray(SLOT - 1))])
    with pytest.raises(ValueError, match="one view of at least"):
        tier.get_into(keys, bufs)
    assert tier.stats.hits == 0  # nothing was read
    tier.close()


def test_a_read_of_megabytes_is_split_across_two_threads_with_the_same_verdicts(
        tmp_path: Path) -> None:
    """Six records of 1 MiB (past ``READ_APART``) are read on two threads, a damaged record
    in each half: each costs exactly its own record, the others land in their own slots,
    and ``get`` agrees."""
    size = 1 << 20
    tier = DiskTier(tmp_path, 8 * (HEADER_BYTES + size), size, geometry=GEOMETRY, fsync=False)
    names = ["a", "b", "c", "d", "e", "f"]
    keys = [key(n) for n in names]
    assert tier.put([(key(n), payload(n, size)) for n in names]) == keys
    _flip_payload(record_path(tmp_path, key("b")))
    _truncate(record_path(tmp_path, key("e")))
    slots = np.zeros((len(names), size), dtype=np.uint8)
    got = tier.get_into(keys, [memoryview(row.data) for row in slots])
    intact = [n for n in names if n not in ("b", "e")]
    assert list(got) == [key(n) for n in intact]
    for i, n in enumerate(names):
        if n in intact:
            assert bytes(got[key(n)]) == bytes(slots[i]) == payload(n, size)
    assert (tier.stats.hits, tier.stats.corrupt) == (4, 2)
    assert not record_path(tmp_path, key("b")).exists()
    assert not record_path(tmp_path, key("e")).exists()
    assert any(t.name.startswith("kvtier-disk-read") for t in threading.enumerate())
    assert {k: bytes(v) for k, v in tier.get(keys).items()} == {
        key(n): payload(n, size) for n in intact}
    tier.close()
    assert not any(t.name.startswith("kvtier-disk-read") for t in threading.enumerate())
