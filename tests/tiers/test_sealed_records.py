"""Sealed records (a MAC, or AES-GCM encryption, under a secret): a writer without the
secret cannot forge a chunk, a tampered or re-keyed record is a counted miss and removed,
encrypted records do not show the payload, and secrets are never printed."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from tier_helpers import GEOMETRY, SLOT, Clock, RedisServer, items, key, payload

from kvtier.keys import ChunkKey
from kvtier.store import ChunkState, StoreHandle
from kvtier.tiers.config import DiskConfig, HostConfig, RedisConfig, TierConfig
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.lower import LowerTier
from kvtier.tiers.records.format import HEADER_BYTES
from kvtier.tiers.records.seal import AeadSeal, MacSeal, Seal, Secret
from kvtier.tiers.redis.tier import RedisTier
from kvtier.tiers.tiered import TieredStore

SECRET = Secret(b"s3cret-for-tests-0123456789abcdef", "tests")
OTHER = Secret(b"another-secret-0123456789abcdef!", "tests")
SEALS = {"mac": MacSeal, "aead": AeadSeal}


class Medium:
    """One kind of lower tier, and its raw records, for a test to forge and tamper with."""

    def __init__(self, kind: str, tmp_path: Path, server: RedisServer | None) -> None:
        self.kind, self.path, self.server = kind, tmp_path / "disk", server
        self.made: list[LowerTier] = []

    def tier(self, seal: Seal | None) -> LowerTier:
        for t in self.made:
            t.close()  # one process may hold a directory at a time
        tier: LowerTier
        if self.server is not None:
            tier = RedisTier(self.server.url, geometry=GEOMETRY, seal=seal)
        else:
            tier = DiskTier(self.path, 16 * (HEADER_BYTES + SLOT + 64), SLOT,
                            geometry=GEOMETRY, seal=seal)
        self.made.append(tier)
        return tier

    def raw(self, k: ChunkKey) -> bytes | None:
        if self.server is not None:
            return self.server.client().get(f"kvtier:{k.hex()}")  # type: ignore[attr-defined]
        file = self.path / "chunks" / k.hex()
        return file.read_bytes() if file.exists() else None

    def put_raw(self, k: ChunkKey, record: bytes) -> None:
        if self.server is not None:
            self.server.client().set(f"kvtier:{k.hex()}", record)  # type: ignore[attr-defined]
        else:
            (self.path / "chunks" / k.hex()).write_bytes(record)


@pytest.fixture(params=["disk", pytest.param("redis", marks=pytest.mark.redis)])
def medium(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Medium]:
    server = request.getfixturevalue("redis_server") if request.param == "redis" else None
    m = Medium(request.param, tmp_path, server)
    yield m
    for t in m.made:
        t.close()


def rekeyed(record: bytes, k: ChunkKey) -> bytes:
    """``record`` claiming key ``k``, its header checksum fixed (the documented format): a
    forger's attempt to move a chunk under another key."""
    head = record[:8] + k + record[48 : HEADER_BYTES - 4]
    return head + zlib.crc32(head).to_bytes(4, "little") + record[HEADER_BYTES:]


@pytest.mark.parametrize("kind", SEALS)
def test_sealed_records_round_trip(medium: Medium, kind: str) -> None:
    tier = medium.tier(SEALS[kind](SECRET))
    assert tier.put(items("ab")) == [key("a"), key("b")]
    got = tier.get([key("a"), key("b")])
    assert {k: bytes(v) for k, v in got.items()} == dict(items("ab"))


@pytest.mark.parametrize("kind", SEALS)
@pytest.mark.parametrize("forger", ["no secret", "another secret"])
def test_a_writer_without_the_secret_cannot_forge_a_chunk(medium: Medium, kind: str,
                                                           forger: str) -> None:
    seal = SEALS[kind]
    medium.tier(None if forger == "no secret" else seal(OTHER)).put(items("a"))
    reader = medium.tier(seal(SECRET))
    assert reader.get([key("a")]) == {} and reader.stats.corrupt == 1
    assert medium.raw(key("a")) is None  # removed: the tier owns its records


@pytest.mark.parametrize("kind", SEALS)
@pytest.mark.parametrize("attack", ["flip a payload byte", "re-key the header",
                                    "move to another key"])
def test_tampered_or_swapped_records_are_counted_misses(medium: Medium, kind: str,
                                                        attack: str) -> None:
    tier = medium.tier(SEALS[kind](SECRET))
    tier.put(items("ab"))
    record = medium.raw(key("a"))
    assert record is not None
    if attack == "flip a payload byte":
        forged = bytearray(record)
        forged[HEADER_BYTES + 100] ^= 0x01
        medium.put_raw(key("a"), bytes(forged))
        target = key("a")
    else:  # b's name now holds a's record, its header claiming b or still a
        target = key("b")
        medium.put_raw(target, rekeyed(record, target) if "re-key" in attack else record)
    reader = medium.tier(SEALS[kind](SECRET))
    assert target not in reader.get([key("a"), key("b")])
    if medium.kind == "disk" and attack == "move to another key":
        # a file whose header names another key is not provably the tier's: left alone
        assert reader.stats.foreign == 1 and medium.raw(target) == record
    else:
        assert reader.stats.corrupt == 1 and medium.raw(target) is None


def test_a_reader_without_the_secret_reads_no_sealed_record(medium: Medium) -> None:
    medium.tier(MacSeal(SECRET)).put(items("a"))
    plain = medium.tier(None)
    assert plain.get([key("a")]) == {} and plain.stats.corrupt == 1


def test_encrypted_records_hide_the_payload_and_never_repeat(medium: Medium) -> None:
    tier = medium.tier(AeadSeal(SECRET))
    same = payload("same")
    tier.put([(key("a"), same), (key("b"), same)])
    ra, rb = medium.raw(key("a")), medium.raw(key("b"))
    assert ra is not None and rb is not None
    assert same[:64] not in ra and ra[HEADER_BYTES:] != rb[HEADER_BYTES:]  # fresh nonces
    assert bytes(tier.get([key("a")])[key("a")]) == same


def test_secrets_load_from_a_file_or_the_environment_and_never_print(tmp_path, monkeypatch):
    value = "correct-horse-battery-staple-42"
    (tmp_path / "secret").write_text(value + "\n")
    monkeypatch.setenv("KVTIER_TEST_SECRET", value)
    from_file = Secret.load(file=str(tmp_path / "secret"))
    from_env = Secret.load(env="KVTIER_TEST_SECRET")
    assert from_file.derive("mac") == from_env.derive("mac") != from_env.derive("aead")
    disk = DiskConfig(str(tmp_path / "d"), "1MB", secret_env="KVTIER_TEST_SECRET",
                      encrypt=True)
    redis = RedisConfig(secret_file=str(tmp_path / "secret"))
    for shown in (from_file, from_env, MacSeal(from_env), AeadSeal(from_env), disk, redis,
                  disk.seal(), redis.seal()):
        assert value not in repr(shown) and value not in str(shown)


@pytest.mark.parametrize("fields, message", [
    ({"secret_env": "KVTIER_TEST_UNSET"}, "KVTIER_TEST_UNSET holds no secret"),
    ({"secret_file": "/nonexistent/secret"}, "secret file /nonexistent/secret: cannot read"),
    ({"secret_env": "KVTIER_TEST_SHORT"}, "at least 16"),
    ({"encrypt": True}, "needs a key"),
    ({"secret_env": "KVTIER_TEST_SHORT", "secret_file": "x"}, "not both"),
    ({"encrypt": "yes", "secret_env": "KVTIER_TEST_SHORT"}, "encrypt: must be true or false"),
])
def test_bad_secret_settings_are_clear_errors(monkeypatch, fields, message) -> None:
    monkeypatch.delenv("KVTIER_TEST_UNSET", raising=False)
    monkeypatch.setenv("KVTIER_TEST_SHORT", "short")
    for cls in (DiskConfig, RedisConfig):
        args = ("/tmp/unused", "1MB") if cls is DiskConfig else ()
        with pytest.raises(ValueError, match=message) as info:
            cls(*args, **fields)
        assert "short" not in str(info.value).replace("KVTIER_TEST_SHORT", "")


@pytest.mark.parametrize("encrypt", [False, True])
def test_a_sealed_disk_tier_through_the_config(tmp_path, monkeypatch, encrypt) -> None:
    monkeypatch.setenv("KVTIER_TEST_SECRET", "correct-horse-battery-staple-42")
    from kvtier.layout import Group, Layout

    layout = Layout((Group("full", 16, bytes_per_token=SLOT // 16),))
    config = TierConfig(host=HostConfig(SLOT), disk=DiskConfig(
        str(tmp_path), 8 * (HEADER_BYTES + 2 * SLOT), secret_env="KVTIER_TEST_SECRET",
        encrypt=encrypt))
    with TieredStore.from_config(config, layout, clock=Clock()) as store:
        for name in "ab":  # one host slot: a goes down to disk, sealed
            handle = store.prepare_store([key(name)])
            assert isinstance(handle, StoreHandle)
            store.backend.write(handle.slots[0], payload(name))
            store.complete_store(handle, ok=True)
        assert store.flush()
        assert (payload("a")[:64] in (tmp_path / "chunks" / key("a").hex()).read_bytes()) == (
            not encrypt)
        assert store.lookup([key("a")]) == [ChunkState.WRITING] and store.flush()
        assert store.lookup([key("a")]) == [ChunkState.READY]
        load = store.prepare_load([key("a")])
        assert store.backend.read(load.slots[0]) == payload("a")
        store.complete_load(load)
