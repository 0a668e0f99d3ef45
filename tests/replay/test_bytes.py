"""``kvtier replay --bytes``: the replay over a real TieredStore, every loaded chunk verified.

Why the hit rates must equal the metadata replay's: both run the same store rules
(``kvtier.replay.store.ReplayStore``) over different tiers; block hits count chunks
present in any tier, and the planner restores what is present anywhere (a chunk below is
promoted while it WAITs). With a disk (or Redis) that never evicts, every chunk ever
stored stays in some tier in both stores, whatever host memory holds (host recency may
differ by the real tiers' promotion rounds), so the present sets, and hence the hits, are
the same. Only the split of loads between host and disk may differ.
"""

from __future__ import annotations

import doctest
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.cli.main import main
from kvtier.presets import preset
from kvtier.replay import ReplayConfig, ReplayStats, Workload, bytes_store, read_trace, replay
from kvtier.replay.bytes_run import BytesOptions, replay_bytes

PREFIX, HOST = 300, 300


@pytest.fixture(scope="module")
def workload() -> Workload:
    return Workload(read_trace(limit=PREFIX), ReplayConfig(preset("llama-3.1-8b")))


@pytest.fixture(scope="module")
def model(workload: Workload) -> ReplayStats:
    """The metadata replay with a disk that never evicts."""
    return replay(workload, "lru", HOST, workload.num_distinct_chunks())


def loaded(s: ReplayStats) -> int:
    return sum(s.chunks_loaded_by_tier.values())


def assert_all_verified(s: ReplayStats) -> None:
    assert s.corrupt_chunks == 0
    assert s.verified_chunks == loaded(s) == s.tiers["host"]["chunks_read"] > 0


def test_hits_equal_the_model_when_the_disk_never_evicts(
    workload: Workload, model: ReplayStats
) -> None:
    real = replay_bytes(workload, "lru", HOST, workload.num_distinct_chunks())
    assert (real.block_hits, real.hit_tokens) == (model.block_hits, model.hit_tokens)
    assert loaded(real) == loaded(model) and real.slots == model.slots
    assert_all_verified(real)
    disk = real.tiers["disk"]
    assert disk["evicted"] == 0 and disk["corrupt"] == 0
    assert disk["hits"] == real.chunks_loaded_by_tier["disk"] > 0 and real.waits > 0
    assert disk["bytes_read"] == disk["hits"] * 4096
    assert disk["real_bytes_read"] == disk["hits"] * preset("llama-3.1-8b").max_bytes_per_chunk


def test_a_corrupted_disk_file_is_a_counted_miss(
    workload: Workload, model: ReplayStats, tmp_path: Path
) -> None:
    done = 0

    def corrupt_every_chunk_file_midway(n: int) -> None:
        nonlocal done
        done += n
        if done == PREFIX // 2:
            for f in (tmp_path / "lru" / "chunks").iterdir():
                if len(f.name) == 80:  # a published chunk, not a temporary
                    flip_last_byte(f)

    real = replay_bytes(workload, "lru", HOST, workload.num_distinct_chunks(),
                        corrupt_every_chunk_file_midway,
                        options=BytesOptions(disk_dir=str(tmp_path)))
    assert real.tiers["disk"]["corrupt"] > 0
    assert real.hit_tokens < model.hit_tokens  # misses, recomputed
    assert_all_verified(real)  # never wrong bytes


def flip_last_byte(path: Path) -> None:
    try:
        with open(path, "r+b") as f:
            f.seek(-1, 2)
            last = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([last[0] ^ 0xFF]))
    except FileNotFoundError:  # dropped meanwhile
        pass


# ---- Redis ------------------------------------------------------------------------------


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A private ``redis-server`` on a free loopback port, killed at teardown."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not on PATH")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert answers(port), "redis-server did not start"
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def answers(port: int, timeout_s: float = 10.0) -> bool:
    """A bounded poll for the server's PING."""
    import redis

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with redis.Redis(port=port, socket_timeout=0.2) as client:
                return bool(client.ping())
        except redis.RedisError:
            time.sleep(0.02)
    return False


@pytest.mark.redis
def test_redis_below_host_equals_the_model(
    workload: Workload, model: ReplayStats, redis_url: str
) -> None:
    real = replay_bytes(workload, "lru", HOST, options=BytesOptions(redis_url=redis_url))
    assert (real.block_hits, real.hit_tokens) == (model.block_hits, model.hit_tokens)
    assert_all_verified(real)
    assert real.tiers["redis"]["hits"] == real.chunks_loaded_by_tier["redis"] > 0
    assert real.tiers["redis"]["errors"] == 0 and real.slots == {"host": HOST}


# ---- the command ------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["replay", "--model", "llama-3.1-8b", *argv])
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_and_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["--limit", "60", "--host-chunks", "100", "--disk-chunks", "100000", "--bytes"]
    code, out, _ = run(capsys, *argv, "--slot-bytes", "1KiB", "--json")
    lru = json.loads(out)["policies"]["lru"]
    assert code == 0 and lru["corrupt_chunks"] == 0 and lru["verified_chunks"] > 0
    assert set(lru["tiers"]) == {"host", "disk"} and lru["tiers"]["host"]["bytes_read"] == (
        lru["verified_chunks"] * 1024)
    code, out, _ = run(capsys, *argv, "--disk-dir", str(tmp_path))
    assert code == 0 and "verified byte for byte" in out and (tmp_path / "lru").is_dir()


@pytest.mark.parametrize(("argv", "message"), [
    (["--slot-bytes", "1KiB"], "--slot-bytes needs --bytes"),
    (["--bytes", "--concurrent"], "drop --concurrent"),
    (["--bytes", "--disk-dir", "{tmp}"], "--disk-dir needs a disk tier"),
    (["--bytes", "--disk", "1TiB", "--disk-dir", "{tmp}/file/sub"], "not a writable directory"),
    (["--bytes", "--redis", "http://localhost"], "--redis: redis tier: url: must look like"),
])
def test_bad_arguments_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    (tmp_path / "file").write_text("")
    code, out, err = run(capsys, "--limit", "5", *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_doctests() -> None:
    result = doctest.testmod(bytes_store)
    assert result.failed == 0 and result.attempted > 0
