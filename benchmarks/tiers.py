"""Tier benchmark: disk and Redis tiers against bare I/O moving the same bytes.

One run measures, on chunks of 2 MiB (16 tokens of an 8B model in bfloat16), in batches
of 8 chunks (one write-back or promotion batch):

* disk write: ``DiskTier.put`` (record header, crc32, write, fsync, rename, one directory
  fsync per batch) against plain writes of the same payloads, one file each, with the same
  flush discipline (fsync each file, fsync the directory once per batch);
* disk read: ``DiskTier.get`` (read, verify header and crc32) against plain whole-file
  reads of the same files, a batch of results held at a time by both, from the device
  (every file's pages are dropped with ``posix_fadvise(DONTNEED)`` first); the same from
  the page cache is reported too (``warm_read``), without a target: there the figure is
  memory bandwidth against crc32 speed, not disk;
* Redis write and read: ``RedisTier.put`` / ``get`` against a bare redis-py pipeline of
  SET / GET of the same payloads, on a private ``redis-server`` started for the run; which
  of the two goes first alternates from round to round;
* Redis Cluster write and read: the same on a private three-master cluster
  (``tests/redis_cluster.py``), the tier given the start-up nodes, the bare side a
  redis-py ``RedisCluster`` pipeline (which splits each batch by node as the tier does).

* sealed records: the same tier storing and loading the same chunks as plain records
  (crc32), as MAC records (HMAC-SHA256) and as encrypted records (AES-256-GCM), in turn,
  in the same process (``kvtier.tiers.records.seal``); reported as plain time over sealed time
  (``*_mac_write_ratio`` ...; 1.0 is free). Disk here skips fsync and reads from the page
  cache, so the ratio is the sealing's CPU cost where the medium is fastest: an upper
  bound of its relative cost on a real device.

Every figure is a ratio of bandwidths, tier over bare, the best of ``--repeats``
interleaved runs (the machine is shared and noisy); ``*_ratio_median`` is the median over
rounds of each round's own ratio, the steadier figure when other work comes and goes.
Targets: disk at least 0.7 of bare, Redis and the cluster at least 0.8. Prints a table,
then as its last line one JSON object. The chunks, batches and private servers it runs on
are in ``benchmarks/tier_setup.py``.

    python benchmarks/tiers.py [--quick] [--seals-only] [--redis-url redis://host:port/0]
                               [--cluster-nodes host:port,host:port]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvtier.buildinfo import describe
from kvtier.tiers.disk.tier import DiskTier
from kvtier.tiers.records.format import CRC32_BY, HEADER_BYTES
from kvtier.tiers.records.seal import AeadSeal, MacSeal, Seal, Secret
from kvtier.tiers.redis.tier import RedisTier
from tier_setup import (
    BATCH,
    CHUNK,
    Item,
    batches,
    make_items,
    read_batches,
    redis_cluster,
    redis_server,
    timed,
)

TARGETS = {"disk_write_ratio": 0.7, "disk_read_ratio": 0.7,
           "redis_write_ratio": 0.8, "redis_read_ratio": 0.8,
           "cluster_write_ratio": 0.8, "cluster_read_ratio": 0.8}

# ---- disk --------------------------------------------------------------------------------


def bare_disk_write(root: Path, items: list[Item]) -> None:
    for batch in batches(items):
        for k, data in batch:
            fd = os.open(root / k.hex(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        dfd = os.open(root, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)


def bare_disk_read(root: Path, items: list[Item]) -> None:
    """Whole-file reads, a batch of results held at a time (as the tier returns them)."""
    for batch in batches(items):
        held = []
        for k, _ in batch:
            with open(root / k.hex(), "rb", buffering=0) as f:
                held.append(f.read())


def evict_page_cache(root: Path) -> None:
    """Drop the (clean, fsynced) pages of every file under ``root``: the next read is
    served by the device."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def disk_round(work: Path, items: list[Item], n: int) -> dict[str, float]:
    """One interleaved round: seconds for bare and tier writes and reads."""
    bare = work / f"bare-{n}"
    bare.mkdir()
    tier = DiskTier(work / f"tier-{n}", 2 * len(items) * (HEADER_BYTES + CHUNK), CHUNK)
    keys = [k for k, _ in items]
    try:
        out = {
            "bare_write": timed(lambda: bare_disk_write(bare, items)),
            "tier_write": timed(lambda: [tier.put(b) for b in batches(items)]),
        }
        for root in (bare, work / f"tier-{n}"):
            evict_page_cache(root)
        out["bare_read"] = timed(lambda: bare_disk_read(bare, items))
        out["tier_read"] = timed(lambda: read_batches(tier.get, keys))
        out["bare_warm_read"] = timed(lambda: bare_disk_read(bare, items))  # page cache
        out["tier_warm_read"] = timed(lambda: read_batches(tier.get, keys))
        assert tier.stats.hits == 2 * len(items) and tier.stats.corrupt == 0
        return out
    finally:
        tier.close()
        shutil.rmtree(bare)
        shutil.rmtree(work / f"tier-{n}")


# ---- redis -------------------------------------------------------------------------------


def redis_round(url: str, items: list[Item], n: int) -> dict[str, float]:
    import redis

    bare = redis.Redis.from_url(url, socket_timeout=30)
    return remote_round(bare, RedisTier(url, namespace="bench-tier", timeout_s=30), items, n)


def cluster_round(nodes: Sequence[str], items: list[Item], n: int) -> dict[str, float]:
    from redis.cluster import ClusterNode, RedisCluster

    startup = [ClusterNode(*node.rsplit(":", 1)) for node in nodes]
    bare = RedisCluster(startup_nodes=startup, socket_timeout=30)
    tier = RedisTier(cluster_nodes=nodes, namespace="bench-tier", timeout_s=30)
    return remote_round(bare, tier, items, n)


def remote_round(bare: Any, tier: RedisTier, items: list[Item], n: int) -> dict[str, float]:
    """One interleaved round on one server or cluster: seconds for the bare redis-py
    client's pipelines and the tier's batches, writing then reading ``items``."""
    names = [f"bench-bare:{k.hex()}" for k, _ in items]
    keys = [k for k, _ in items]

    def bare_set() -> None:
        for i in range(0, len(items), BATCH):
            pipe = bare.pipeline(transaction=False)
            for name, (_, data) in zip(names[i : i + BATCH], items[i : i + BATCH], strict=True):
                pipe.set(name, data)
            pipe.execute()

    def bare_get() -> None:
        for i in range(0, len(items), BATCH):
            pipe = bare.pipeline(transaction=False)
            for name in names[i : i + BATCH]:
                pipe.get(name)
            pipe.execute()

    runs: dict[str, Callable[[], object]] = {
        "bare_write": bare_set,
        "tier_write": lambda: [tier.put(b) for b in batches(items)],
        "bare_read": bare_get,
        "tier_read": lambda: read_batches(tier.get, keys),
    }
    order = list(runs) if n % 2 == 0 else ["tier_write", "bare_write", "tier_read", "bare_read"]
    try:
        out = {name: timed(runs[name]) for name in order}
        assert tier.stats.hits == len(items) and tier.stats.errors == 0
        bare.flushdb()
        return out
    finally:
        tier.close()
        bare.close()


# ---- sealed records ----------------------------------------------------------------------

SECRET = Secret(os.urandom(32), "the benchmark")
SEALS: dict[str, Seal | None] = {"plain": None, "mac": MacSeal(SECRET), "aead": AeadSeal(SECRET)}
TierOf = Callable[[Seal | None, str], Any]
"""Builds a tier of one medium with a seal, under a name unique to the round."""


def seal_round(make: TierOf, items: list[Item], n: int) -> dict[str, float]:
    """Seconds to store and load ``items`` through a tier of each seal (plain, MAC, AEAD),
    the order rotating from round to round."""
    kinds = list(SEALS)[n % 3 :] + list(SEALS)[: n % 3]
    out = {}
    for kind in kinds:
        tier = make(SEALS[kind], f"{kind}-{n}")
        try:
            out[f"{kind}_write"], out[f"{kind}_read"] = store_and_load(tier, items)
        finally:
            tier.close()
    return out


def store_and_load(tier: Any, items: list[Item]) -> tuple[float, float]:
    """Seconds to store ``items`` in batches, then to load them; the tier is left empty."""
    keys = [k for k, _ in items]
    write = timed(lambda: [tier.put(b) for b in batches(items)])
    read = timed(lambda: read_batches(tier.get, keys))
    assert tier.stats.hits == len(items) and tier.stats.corrupt == 0
    tier.remove(keys)
    return write, read


def seal_figures(prefix: str, rounds: list[dict[str, float]]) -> dict[str, float]:
    """Plain time over sealed time, per seal and operation: best times, and the median of
    each round's own ratio."""
    out = {}
    for kind in ("mac", "aead"):
        for op in ("write", "read"):
            plain, sealed = f"plain_{op}", f"{kind}_{op}"
            best_ratio = min(r[plain] for r in rounds) / min(r[sealed] for r in rounds)
            out[f"{prefix}_{kind}_{op}_ratio"] = round(best_ratio, 3)
            out[f"{prefix}_{kind}_{op}_ratio_median"] = round(
                statistics.median(r[plain] / r[sealed] for r in rounds), 3)
    return out


def seal_tiers(work: Path, url: str, n_items: int) -> dict[str, TierOf]:
    size = 2 * n_items * (HEADER_BYTES + CHUNK + 64)
    return {
        "disk": lambda seal, name: DiskTier(work / name, size, CHUNK, seal=seal, fsync=False),
        "redis": lambda seal, name: RedisTier(url, namespace=f"bench-{name}", timeout_s=30,
                                              seal=seal),
    }


def print_seal_table(figures: dict[str, Any]) -> None:
    print(f"\n{'tier':<7}{'record':<8}{'write':>8}{'read':>8}   (plain time / sealed time)")
    for tier in ("disk", "redis"):
        for kind in ("mac", "aead"):
            print(f"{tier:<7}{kind:<8}{figures[f'{tier}_{kind}_write_ratio']:>8.2f}"
                  f"{figures[f'{tier}_{kind}_read_ratio']:>8.2f}")


# ---- report ------------------------------------------------------------------------------


def best(rounds: list[dict[str, float]], nbytes: int) -> dict[str, float]:
    """Best bandwidth (GB/s) of each measurement over the rounds."""
    return {name: nbytes / min(r[name] for r in rounds) / 1e9 for name in rounds[0]}


def median_ratios(prefix: str, rounds: list[dict[str, float]]) -> dict[str, float]:
    """Per operation, the median over rounds of bare time over tier time."""
    ops = [name.removeprefix("tier_") for name in rounds[0] if name.startswith("tier_")]
    return {f"{prefix}_{op}_ratio_median":
            round(statistics.median(r[f"bare_{op}"] / r[f"tier_{op}"] for r in rounds), 3)
            for op in ops}


def figures_of(prefix: str, bw: dict[str, float]) -> dict[str, float]:
    warm = {}
    if "tier_warm_read" in bw:
        warm = {
            f"{prefix}_warm_read_gbps": round(bw["tier_warm_read"], 3),
            f"{prefix}_bare_warm_read_gbps": round(bw["bare_warm_read"], 3),
            f"{prefix}_warm_read_ratio": round(bw["tier_warm_read"] / bw["bare_warm_read"], 3),
        }
    return warm | {
        f"{prefix}_write_gbps": round(bw["tier_write"], 3),
        f"{prefix}_bare_write_gbps": round(bw["bare_write"], 3),
        f"{prefix}_write_ratio": round(bw["tier_write"] / bw["bare_write"], 3),
        f"{prefix}_read_gbps": round(bw["tier_read"], 3),
        f"{prefix}_bare_read_gbps": round(bw["bare_read"], 3),
        f"{prefix}_read_ratio": round(bw["tier_read"] / bw["bare_read"], 3),
    }


def print_table(figures: dict[str, Any]) -> None:
    print(f"{'tier':<9}{'op':<11}{'tier GB/s':>11}{'bare GB/s':>11}{'ratio':>8}{'target':>8}"
          f"{'median':>8}")
    for tier, op in (("disk", "write"), ("disk", "read"), ("disk", "warm_read"),
                     ("redis", "write"), ("redis", "read"),
                     ("cluster", "write"), ("cluster", "read")):
        target = TARGETS.get(f"{tier}_{op}_ratio")
        print(f"{tier:<9}{op:<11}{figures[f'{tier}_{op}_gbps']:>11.3f}"
              f"{figures[f'{tier}_bare_{op}_gbps']:>11.3f}{figures[f'{tier}_{op}_ratio']:>8.2f}"
              f"{'-' if target is None else f'{target:.2f}':>8}"
              f"{figures[f'{tier}_{op}_ratio_median']:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer chunks and repeats")
    parser.add_argument("--chunks", type=int, default=48, help="2 MiB chunks per round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--redis-url", default=None, help="an existing server (default: own)")
    parser.add_argument("--cluster-nodes", default=None,
                        help="an existing cluster's start-up nodes, host:port,... (default: own)")
    parser.add_argument("--seals-only", action="store_true",
                        help="only the cost of sealed records against plain ones")
    args = parser.parse_args()
    n, repeats = (16, 2) if args.quick else (args.chunks, args.repeats)
    items = make_items(n)
    nbytes = n * CHUNK
    figures: dict[str, Any] = {"chunk_bytes": CHUNK, "chunks": n, "batch": BATCH}
    with tempfile.TemporaryDirectory() as work, redis_server(args.redis_url) as url:
        if not args.seals_only:
            disk = [disk_round(Path(work), items, i) for i in range(repeats)]
            remote = [redis_round(url, items, i) for i in range(repeats)]
            with redis_cluster(args.cluster_nodes) as nodes:
                cluster = [cluster_round(nodes, items, i) for i in range(repeats)]
            for name, rounds in (("disk", disk), ("redis", remote), ("cluster", cluster)):
                figures |= figures_of(name, best(rounds, nbytes)) | median_ratios(name, rounds)
        for medium, make in seal_tiers(Path(work), url, n).items():
            figures |= seal_figures(medium, [seal_round(make, items, i) for i in range(repeats)])
    if not args.seals_only:
        print_table(figures)
    print_seal_table(figures)
    met = None if args.seals_only else all(figures[name] >= target
                                           for name, target in TARGETS.items())
    print(f"build: {describe()}; records' CRC-32 by {CRC32_BY} (the fast extra: isal)")
    print(json.dumps({"benchmark": "tiers", "build": describe(), "crc32": CRC32_BY,
                      "figures": figures, "targets": TARGETS, "met": met}))


if __name__ == "__main__":
    main()
