"""What a record below host memory may hold: exactly its chunk's bytes, never the end of
the slot's previous chunk (another tenant's, perhaps), and never bytes another model or KV
dtype wrote, whatever namespace the caller passes."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from tier_helpers import GEOMETRY, SLOT, Clock, key, payload

from kvtier.keys import ChunkKey, KeyChain, Namespace
from kvtier.layout import Group, Layout
from kvtier.store import ChunkState, ChunkStore, StoreHandle
from kvtier.tiers.config import DiskConfig, HostConfig, TierConfig, WritePolicy
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.host import HostSlab
from kvtier.tiers.records.format import CRC32_BY, HEADER_BYTES, geometry_of
from kvtier.tiers.tiered import TieredStore

SHORT = 10


def store_bytes(store: TieredStore, k: ChunkKey, data: bytes, ok: bool = True) -> None:
    """Store ``data`` as chunk ``k`` as the data plane would (``ok=False``: a store that
    failed after writing)."""
    handle = store.prepare_store([k])
    assert isinstance(handle, StoreHandle) and handle.keys == (k,)
    store.backend.write(handle.slots[0], data)
    store.complete_store(handle, ok=ok)


def disk_payload(path: Path, k: ChunkKey, slot: int = SLOT, geometry: bytes = GEOMETRY) -> bytes:
    tier = DiskTier(path, 8 * (HEADER_BYTES + slot), slot, geometry=geometry)
    try:
        return bytes(tier.get([k])[k])
    finally:
        tier.close()


@pytest.mark.parametrize("policy", ["write-back", "write-through"])
@pytest.mark.parametrize("previous", ["evicted", "failed store"])
def test_a_short_chunk_carries_no_byte_of_the_slots_previous_chunk(
    tmp_path: Path, policy: WritePolicy, previous: str
) -> None:
    disk = DiskTier(tmp_path, 8 * (HEADER_BYTES + SLOT), SLOT, geometry=GEOMETRY)
    host = ChunkStore(backend=HostSlab(1, SLOT, pin_memory=False))
    with TieredStore(host, [disk], write_policy=policy, clock=Clock()) as store:
        store_bytes(store, key("tenant-a"), b"\xaa" * SLOT, ok=previous == "evicted")
        store_bytes(store, key("tenant-b"), b"\x01" * SHORT)  # the same slot, reused
        store_bytes(store, key("later"), b"\x02" * SLOT)  # evicts tenant-b's chunk
    assert disk_payload(tmp_path, key("tenant-b")) == b"\x01" * SHORT + bytes(SLOT - SHORT)


def test_a_layouts_smaller_group_leaves_nothing_of_a_larger_chunk(tmp_path: Path) -> None:
    """Through ``from_config``: the slab knows the layout's smallest chunk."""
    layout = Layout((Group("full", 16, bytes_per_token=16),
                     Group("sliding_window", 4, window=8, bytes_per_token=16)))
    big, small = (g.bytes_per_chunk or 0 for g in layout.groups)  # 256 and 64 bytes
    config = TierConfig(host=HostConfig(big), write_policy="write-back",
                        disk=DiskConfig(str(tmp_path), 8 * (HEADER_BYTES + big)))
    with TieredStore.from_config(config, layout, clock=Clock()) as store:
        store_bytes(store, key("full"), b"\xaa" * big)
        store_bytes(store, key("window"), b"\x01" * small)
        store_bytes(store, key("later"), b"\x02" * big)
    stored = disk_payload(tmp_path, key("window"), big, geometry_of(layout))
    assert stored == b"\x01" * small + bytes(big - small)


LAYOUT = Layout((Group("full", 16, bytes_per_token=16),), model="model-a",
                kv_dtype="fp8_e4m3")


def writer_then_reader(tmp_path: Path, reader: Layout) -> tuple[ChunkKey, TieredStore]:
    """Chunk 0 of tokens 0..15 written through the library's default namespace by a
    ``LAYOUT`` writer (write-through to disk); a ``reader`` store over the same directory."""
    def config() -> TierConfig:
        return TierConfig(host=HostConfig(4 * SLOT), write_policy="write-through",
                          disk=DiskConfig(str(tmp_path), 8 * (HEADER_BYTES + SLOT)))

    written = KeyChain(LAYOUT, Namespace("shared"), range(16)).key(0, 0)
    assert written is not None
    with TieredStore.from_config(config(), LAYOUT, clock=Clock()) as store:
        store_bytes(store, written, b"\x07" * 256)
    return written, TieredStore.from_config(config(), reader, clock=Clock())


def settled(store: TieredStore, k: ChunkKey) -> ChunkState:
    """``k``'s state once a promotion the lookup starts has finished (a bounded loop)."""
    for _ in range(3):
        (state,) = store.lookup([k])
        if state is not ChunkState.WRITING:
            return state
        assert store.flush()
    return state


@pytest.mark.parametrize("change", [{"kv_dtype": "fp8_e5m2"}, {"model": "model-b"}])
def test_another_dtype_or_model_is_never_served_the_writers_bytes(tmp_path, change) -> None:
    reader = replace(LAYOUT, **change)
    written, store = writer_then_reader(tmp_path, reader)
    with store:
        own = KeyChain(reader, Namespace("shared"), range(16)).key(0, 0)
        assert own is not None and own != written
        assert settled(store, own) is ChunkState.ABSENT
        # a caller that passes the writer's very key is refused by the record's geometry
        assert settled(store, written) is ChunkState.ABSENT
        assert store.stats()["disk"]["corrupt"] == 1


def test_the_same_layout_is_served(tmp_path: Path) -> None:
    written, store = writer_then_reader(tmp_path, replace(LAYOUT))
    with store:
        assert settled(store, written) is ChunkState.READY
        load = store.prepare_load([written])
        assert store.backend.read(load.slots[0])[:256] == b"\x07" * 256
        store.complete_load(load)


# ---- one checksum, whichever library computes it ------------------------------------------

WRITE_AND_READ = """
import sys
if sys.argv[1] == "zlib":
    sys.modules["isal"] = None  # a process without the fast extra
sys.path.insert(0, sys.argv[2])
from tier_helpers import GEOMETRY, SLOT, items, key
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.records.format import CRC32_BY
tier = DiskTier(sys.argv[3], 64 * SLOT, SLOT, geometry=GEOMETRY)
if sys.argv[4] == "put":
    assert tier.put(items(["shared"])) == [key("shared")]
else:
    got = tier.get([key("shared")])
    print(CRC32_BY, bytes(got[key("shared")]).hex() if got else "miss", tier.stats.corrupt)
tier.close()
"""


def crc_process(by: str, path: Path, action: str) -> list[str]:
    """Run a process whose records' checksum ``by`` computes ("zlib": isal blocked) over the
    disk tier at ``path``: ``put`` stores chunk "shared", ``get`` prints what it reads."""
    here = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", WRITE_AND_READ, by, here, str(path), action],
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


@pytest.mark.skipif(CRC32_BY != "isal", reason="needs the fast extra (isal) installed")
@pytest.mark.parametrize(("writer", "reader"), [("isal", "zlib"), ("zlib", "isal")])
def test_a_record_checksummed_by_one_library_reads_in_a_process_with_the_other(
    tmp_path: Path, writer: str, reader: str
) -> None:
    """The fast extra changes the speed, not the record: a fleet mixing processes with and
    without it shares records, and a flipped byte fails whichever library checks it."""
    crc_process(writer, tmp_path, "put")
    assert crc_process(reader, tmp_path, "get") == [reader, payload("shared").hex(), "0"]
    chunk = tmp_path / "chunks" / key("shared").hex()
    assert chunk.is_file()
    raw = bytearray(chunk.read_bytes())
    raw[HEADER_BYTES + 100] ^= 0x01
    chunk.write_bytes(raw)
    assert crc_process(reader, tmp_path, "get") == [reader, "miss", "1"]
