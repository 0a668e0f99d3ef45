"""The connector's tier configuration, refused at start-up with one clear line: the keys
and checks of ``TierConfig``, the ``host_bytes`` shorthand, and a disk path it cannot use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from kvtier.integrations.vllm.config import KvtierOptions
from kvtier.integrations.vllm.testing import SimGroup, VllmSim

pytestmark = pytest.mark.vllm


def start(extra: dict[str, Any]) -> None:
    """Start vLLM's scheduler with the connector configured by ``extra``."""
    VllmSim([SimGroup("full", 16)], "KvtierConnector", {"chunk_tokens": 32, **extra},
            worker=False)


@pytest.mark.parametrize(("extra", "message"), [
    ({"tiers": ["host", "disk"]}, r"unknown option\(s\) \['tiers'\].*known options: .*'disk'"),
    ({"host": {"capacity": "1MiB"}, "host_bytes": 1 << 20}, r"not both"),
    ({"host": {"capacity": "1MiB"}, "policy": "arc"}, r"not both"),
    ({"host": {"capacity": "1MiB", "size": 1}}, r"\[host\]: unknown key 'size'"),
    ({"disk": {"path": "/tmp/x"}}, r"\[disk\]: missing required keys \['capacity'\]"),
    ({"write_policy": "sometimes"}, r"write_policy: must be one of"),
])
def test_bad_tier_config_is_one_clear_line(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        start(extra)
    assert "\n" not in str(err.value)


def test_disk_path_that_cannot_be_a_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match=r"\[disk\].path .*cannot create the directory"):
        start({"disk": {"path": str(blocker / "kv"), "capacity": "1MiB"}})


def test_same_keys_as_the_library() -> None:
    tiers = {"host": {"capacity": "4MiB", "policy": "s3fifo"},
             "disk": {"path": "/tmp/kv", "capacity": "1GiB"},
             "redis": {"url": "redis://127.0.0.1:1/0"}, "write_policy": "write-through"}
    options = KvtierOptions.from_extra_config(tiers)
    assert (options.host_bytes, options.policy) == (4 << 20, "s3fifo")
    assert options.tiers.redis is not None and options.tiers.write_policy == "write-through"
    shorthand = KvtierOptions.from_extra_config({"host_bytes": 1 << 20, "policy": "pfreq"})
    assert shorthand.tiers.host.capacity_bytes == 1 << 20 and shorthand.policy == "pfreq"
