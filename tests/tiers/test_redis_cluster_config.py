"""A Redis Cluster in the configuration: start-up nodes checked like a URL, never with
``url``, secrets never printed, a password from a file, and a hierarchy of host memory,
disk and a cluster built from TOML that a second process reads back."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_hierarchy import host_bytes, promote, store_chunk
from tier_helpers import GEOMETRY, SLOT, Clock, items, key, payload

from kvtier.layout import Group, Layout
from kvtier.store import ChunkState
from kvtier.tiers.config import RedisConfig, TierConfig
from kvtier.tiers.redis.tier import RedisTier
from kvtier.tiers.tiered import TieredStore
from redis_cluster import HAVE_CLUSTER_TOOLS, LocalRedisCluster

SECRET = "cl-s3cr3t_9"


def test_nodes_become_urls_and_round_trip_through_toml_data() -> None:
    cfg = TierConfig.from_dict({"host": {"capacity": "1MiB"}, "redis": {
        "cluster_nodes": ["10.0.0.1:7000", "redis://10.0.0.2:7000", "[::1]:7001"]}})
    assert cfg.redis is not None and cfg.redis.url is None
    assert cfg.redis.cluster_nodes == (
        "redis://10.0.0.1:7000", "redis://10.0.0.2:7000", "redis://[::1]:7001")
    assert RedisConfig(cluster_nodes=["rediss://a:1?ssl_cert_reqs=required",
                                      "rediss://b:1?ssl_cert_reqs=required"]).cluster_nodes


@pytest.mark.parametrize(("nodes", "fault"), [
    ([], "non-empty list"),
    ("10.0.0.1:7000", "non-empty list"),
    ([7000], "must be a host:port string"),
    (["10.0.0.1"], "give each node as host:port"),
    (["10.0.0.1:0"], "port must be"),
    (["10.0.0.1:notaport"], "give each node as host:port"),
    (["unix:///run/redis.sock"], "give each node as host:port"),
    (["redis://a:1/2"], "database 0 only"),
    (["redis://a:1?db=3"], "database 0 only"),
    (["redis://a:1?colour=red"], "unknown URL option"),
    (["redis://a:1", "rediss://b:1"], "same scheme, login and URL options"),
    (["a:1", "redis://a:1"], "listed twice"),
])
def test_a_bad_node_list_is_refused_naming_the_fault(nodes: object, fault: str) -> None:
    for build in (lambda: RedisConfig(cluster_nodes=nodes),  # type: ignore[arg-type]
                  lambda: RedisTier(cluster_nodes=nodes)):  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="cluster_nodes") as info:
            build()
        assert fault in str(info.value)


def test_a_hash_tag_in_the_namespace_is_refused_on_a_cluster() -> None:
    """``{...}`` would make the cluster hash the tag only: every chunk on one node."""
    for build in (lambda: RedisConfig(cluster_nodes=["a:1"], namespace="m{1}"),
                  lambda: RedisTier(cluster_nodes=["a:1"], namespace="m{1}")):
        with pytest.raises(ValueError, match="hash tag"):
            build()
    assert RedisConfig(namespace="m{1}").namespace == "m{1}"  # one server: no slots


def test_url_and_nodes_are_not_both_given() -> None:
    with pytest.raises(ValueError, match="not both"):
        RedisConfig(url="redis://a:1/0", cluster_nodes=["a:1"])
    with pytest.raises(ValueError, match="not both"):
        RedisTier("redis://a:1/0", cluster_nodes=["a:1"])
    with pytest.raises(ValueError, match="unknown key 'nodes'"):
        TierConfig.from_dict({"host": {"capacity": 1}, "redis": {"nodes": ["a:1"]}})


def test_a_password_in_the_nodes_is_never_printed(tmp_path: Path) -> None:
    nodes = [f"redis://u:{SECRET}@a:1", f"redis://u:{SECRET}@b:2"]
    cfg = RedisConfig(cluster_nodes=nodes)
    assert SECRET not in repr(cfg) and "u:***@a:1" in repr(cfg)
    assert SECRET not in RedisTier(cluster_nodes=nodes).url
    with pytest.raises(ValueError) as info:
        RedisConfig(cluster_nodes=[nodes[0], f"redis://v:{SECRET}@b:2"])
    assert "same scheme, login" in str(info.value) and SECRET not in str(info.value)
    (tmp_path / "pw").write_text(SECRET)
    with pytest.raises(ValueError, match="given twice") as info:
        RedisConfig(cluster_nodes=nodes, password_file=str(tmp_path / "pw"))
    assert SECRET not in str(info.value)


# ---- against a real cluster -------------------------------------------------------------

@pytest.fixture
def locked_cluster(tmp_path: Path) -> Iterator[LocalRedisCluster]:
    """A cluster whose every node wants ``SECRET``."""
    if not HAVE_CLUSTER_TOOLS:
        pytest.skip("redis-server/redis-cli not on PATH (CI installs Debian's redis-server)")
    with LocalRedisCluster(tmp_path / "cluster", password=SECRET) as cluster:
        yield cluster


@pytest.mark.redis
def test_a_password_file_logs_in_to_every_node(
    locked_cluster: LocalRedisCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "pw").write_text(SECRET + "\n")
    cfg = RedisConfig(cluster_nodes=locked_cluster.startup_nodes,
                      password_file=str(tmp_path / "pw"))
    names = [f"p{i}" for i in range(24)]
    tier = RedisTier(cluster_nodes=cfg.cluster_nodes, password=cfg.password(),
                     geometry=GEOMETRY)
    assert tier.put(items(names)) == [key(n) for n in names]
    assert len(tier.get([key(n) for n in names])) == 24 and tier.healthy
    tier.close()
    wrong = RedisTier(cluster_nodes=locked_cluster.startup_nodes, password="wrong-pw",
                      geometry=GEOMETRY, clock=Clock())
    with caplog.at_level(logging.WARNING, logger="kvtier.tiers.redis.tier"):
        assert wrong.get([key("p0")]) == {} and wrong.put(items(["p0"])) == []
    assert (wrong.last_error or "").startswith("authentication failed")
    assert "wrong-pw" not in caplog.text and SECRET not in caplog.text
    wrong.close()


@pytest.mark.redis
def test_host_disk_and_cluster_from_toml_serve_a_second_process(
    shared_cluster: LocalRedisCluster, tmp_path: Path
) -> None:
    nodes = ", ".join(f'"{n}"' for n in shared_cluster.startup_nodes[:2])
    toml = tmp_path / "tiers.toml"
    toml.write_text(f"""
write_policy = "write-through"
[host]
capacity = {2 * SLOT}
[disk]
path = "{{disk}}"
capacity = "1MB"
fsync = false
[redis]
cluster_nodes = [{nodes}]
namespace = "tiers-{uuid.uuid4().hex[:8]}"
timeout_s = 0.5
""")
    layout = Layout((Group("full", 16, bytes_per_token=SLOT // 16),))

    def config(disk: str) -> TierConfig:
        (tmp_path / "this.toml").write_text(toml.read_text().replace("{disk}", disk))
        return TierConfig.from_toml(tmp_path / "this.toml")

    with TieredStore.from_config(config(str(tmp_path / "a")), layout, clock=Clock()) as a:
        for n in "abc":
            store_chunk(a, n)
        assert a.flush()
        assert [type(t).__name__ for t in a.lower] == ["DiskTier", "RedisTier"]
    # another node of the fleet: empty host memory, its own empty disk, the same cluster
    with TieredStore.from_config(config(str(tmp_path / "b")), layout, clock=Clock()) as b:
        assert promote(b, ["a", "b"]) == [ChunkState.READY] * 2
        assert host_bytes(b, "a") == payload("a") and host_bytes(b, "b") == payload("b")
        assert b.stats()["redis"]["promoted"] == 2
