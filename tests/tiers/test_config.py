"""The typed tier configuration: sizes, TOML, unknown keys, bad values, and building."""

from __future__ import annotations

from pathlib import Path

import pytest
from tier_helpers import SLOT

from kvtier.layout import Group, Layout
from kvtier.tiers.config import DiskConfig, HostConfig, RedisConfig, TierConfig, parse_size
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.redis.tier import RedisTier
from kvtier.tiers.tiered import TieredStore

TOML = """
write_policy = "write-through"
miss_ttl_s = 0.5

[host]
capacity = "64KiB"
policy = "s3fifo"
pin_memory = false

[disk]
path = "{path}"
capacity = "1MB"
fsync = false

[redis]
url = "redis://127.0.0.1:1/0"
timeout_s = 0.1
ttl_s = 3600
"""


def test_toml_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "tiers.toml"
    path.write_text(TOML.format(path=tmp_path / "disk"))
    cfg = TierConfig.from_toml(path)
    assert cfg.host == HostConfig(capacity=65536, policy="s3fifo", pin_memory=False)
    assert cfg.disk == DiskConfig(path=str(tmp_path / "disk"), capacity=10**6, fsync=False)
    assert cfg.redis == RedisConfig(url="redis://127.0.0.1:1/0", timeout_s=0.1, ttl_s=3600)
    assert (cfg.write_policy, cfg.miss_ttl_s) == ("write-through", 0.5)


def test_building_from_config_orders_tiers_fastest_first(tmp_path: Path) -> None:
    path = tmp_path / "tiers.toml"
    path.write_text(TOML.format(path=tmp_path / "disk"))
    layout = Layout((Group("full", 16, bytes_per_token=SLOT // 16),))
    with TieredStore.from_config(TierConfig.from_toml(path), layout) as store:
        assert [type(t) for t in store.lower] == [DiskTier, RedisTier]
        assert store.num_slots == 16 and store.write_policy == "write-through"


@pytest.mark.parametrize(("text", "expected"), [
    ("64GiB", 64 * 2**30), ("512 MB", 512 * 10**6), ("1.5KiB", 1536), ("7", 7), ("2b", 2),
])
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "12 parsecs", "-1GB", "0", 0, -5, True, 1.5, "GB"])
def test_bad_sizes_say_what_is_accepted(bad: object) -> None:
    with pytest.raises(ValueError, match="expected a positive size"):
        parse_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("data", "message"), [
    ({"host": {"capacity": "1GiB"}, "tier": 1}, r"top level: unknown key 'tier'; known keys"),
    ({"host": {"capacity": "1GiB", "polcy": "lru"}}, r"\[host\]: unknown key 'polcy'"),
    ({"disk": {"path": "/x", "capacity": "1GB"}}, r"missing \[host\] section"),
    ({"host": {}}, r"\[host\]: missing required keys \['capacity'\]"),
    ({"host": {"capacity": "1GiB", "policy": "fifo"}}, r"\[host\].policy: must be one of"),
    ({"host": {"capacity": "1GiB"}, "write_policy": "later"}, r"write_policy: must be one of"),
    ({"host": {"capacity": "1GiB"}, "disk": {"path": "/x", "capacity": "1GB", "workers": 0}},
     r"\[disk\].workers: must be an integer >= 1"),
    ({"host": {"capacity": "1GiB"}, "redis": {"url": "http://x"}}, r"\[redis\].url"),
    ({"host": {"capacity": "1GiB"}, "redis": {"timeout_s": 0}}, r"\[redis\].timeout_s"),
    ({"host": {"capacity": "1GiB"}, "redis": {"backoff_initial_s": 5, "backoff_max_s": 1}},
     r"\[redis\].backoff_max_s: must be a finite number >= 5"),
    ({"host": "big"}, r"\[host\]: expected a table of keys"),
])
def test_bad_config_names_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TierConfig.from_dict(data)


def test_bad_toml_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[host\ncapacity = 1")
    with pytest.raises(ValueError, match="not valid TOML"):
        TierConfig.from_toml(path)


def test_configs_are_frozen() -> None:
    cfg = HostConfig("1GiB")
    with pytest.raises(AttributeError):
        cfg.capacity = 5  # type: ignore[misc]
