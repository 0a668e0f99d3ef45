"""kvtier's vLLM connector against vLLM's native OffloadingConnector, in one process.

Run with the vLLM environment (scripts/install_vllm_test_env.sh):

    .venv-vllm/bin/python benchmarks/vllm_connector.py [--quick]

The same request stream (waves of requests sharing document prefixes, vLLM's device
prefix cache reset between waves so that hits must come from the connector) goes through
vLLM's real ``Scheduler`` three times: with no connector (the baseline), with native
offloading and with kvtier. Workers are emulated the same way for both connectors: every
transfer job is reported done in the step that issued it, so only scheduler-side work is
timed. Reported per configuration: the steps it took, scheduler time per step
(``schedule`` plus ``update_from_output``, best of ``--repeats``: 9, 3 with ``--quick``; best of
3 moved a configuration's figure by 10-15% from run to run here), its overhead over the
baseline, hit tokens, and stored bytes (blocks a store job copies times their bytes). The
last line is one JSON object.

The overhead (``overhead_ms_per_step``, what the target judges) is the scheduler time the
whole stream took with the connector, less what it took without one, over the stream's
steps without one: the same requests served, the same divisor for every configuration.
The configurations do not take the same number of steps: a hit leaves fewer tokens to
prefill (fewer steps under the token budget), and an asynchronous load keeps its request
waiting a step (full attention: 51 steps without a connector, 49 with native's, 42 with
kvtier's). Each configuration's time over its own steps (``ms_per_step``, and
``overhead_ms_per_own_step`` less the baseline's) is printed beside it: it charges a
connector that serves the stream in fewer steps for the steps it saved.

Time is the scheduler thread's CPU time by default (``--clock cpu``: what the scheduler costs,
unaffected by other processes taking the core away on a shared machine); ``--clock wall``
measures elapsed time. The configurations run side by side, a step each in turn
(``measure``), in a new order each turn, so that the machine's slow spells fall on all of
them alike and none always runs after the same one (whose code is then warm in the CPU's
caches); measured one after another, the same build came out ahead of native or behind it
from run to run. Each round starts from a collected heap (``gc.collect()``, untimed):
otherwise the round before leaves its simulators (vLLM's scheduler, its requests, a
connector: reference cycles) for the cyclic collector to free during this one's timed steps.

Then, request by request, the side-by-side table of ``kvtier.integrations.vllm.parity``:
the cases where native once restored more (an exact repeat of a prompt ending on a chunk
boundary, a chunked-local consumer of the start of a prompt, a preempted request resuming)
and their neighbours, plus the stream above: hit tokens and bytes stored per configuration;
``met_parity`` says, per kvtier configuration, whether it hits at least native's tokens in
every row.

Like with like. vLLM's native connector stores prompts only by default
(``offload_prompt_only``); kvtier's default (``store: all``) also stores answers, for multi-
turn chat. This stream never continues a conversation, so no request here can use an answer
chunk, and comparing the defaults would charge kvtier for chunks native never offered to
store. The target is therefore judged on the prompt-only pair: ``native`` against ``kvtier``
(dense boundaries), ``kvtier-shared`` (``boundaries: shared``) and ``kvtier-end``
(``boundaries: end``: like native, a sliding window is stored for each prompt's end only),
all storing prompts only. The answer-storing pair is reported beside it (``native-all`` with
``offload_prompt_only: false`` against ``kvtier-all`` and ``kvtier-shared-all``, kvtier's
default ``store: all``), judged the same way in ``met_all``. With full attention both pairs
store the same chunks; with a sliding window, native serves a hit only at each prompt's end
(and stores no answer chunk of the window group), dense kvtier serves every boundary and
``shared`` the prompt end plus the point where a lookup saw another request's prefix.

``met`` is judged on ``kvtier-end``: the mode that stores by native's own rule (a hit at
each prompt's end), so that all three targets compare the same work. Dense and ``shared``
store more on purpose, to serve hits native cannot (twice native's hit tokens, dense; 67%
more, ``shared``), and are reported as ``met_dense`` and ``met_shared``: with a sliding
window they cannot meet "no more stored bytes" by construction. The build (pure Python or
mypyc-compiled; README, "Compiled build") is printed with the figures: the scheduler-side
overhead differs between them by about 0.05 ms a step.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

from kvtier.buildinfo import describe
from kvtier.integrations.vllm.parity import Row, parity_rows, render, shortfalls
from kvtier.integrations.vllm.testing import (
    SimGroup,
    VllmSim,
    kvtier_jobs_done,
    native_jobs_done,
)

CHUNK = 64
HOST_BYTES = 256 << 20


def stream(seed: int, waves: int, per_wave: int) -> list[list[list[int]]]:
    """Waves of prompts: a shared document prefix (512..1024 tokens) and a unique tail."""
    rng = random.Random(seed)
    docs = [[rng.randrange(1, 30000) for _ in range(rng.randrange(512, 1025))] for _ in range(6)]
    return [[rng.choice(docs) + [rng.randrange(1, 30000) for _ in range(rng.randrange(16, 97))]
             for _ in range(per_wave)] for _ in range(waves)]


def none_report(meta: Any) -> tuple[KVConnectorOutput, int]:
    return KVConnectorOutput(), 0


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def steps(sim: VllmSim, waves: list[list[list[int]]],
          report: Callable[[Any], tuple[KVConnectorOutput, int]], block_bytes: int,
          clock: Callable[[], float], figures: dict[str, Any]) -> Iterator[None]:
    """Drive the stream, one scheduler step per ``next``; ``figures`` gets the scheduler
    seconds, steps, hit tokens and stored bytes at the end."""
    hits = [0]
    connector = sim.scheduler.connector
    if connector is not None:
        original = connector.update_state_after_alloc

        def counting(request: Any, blocks: Any, num_external: int) -> Any:
            hits[0] += num_external
            return original(request, blocks, num_external)

        connector.update_state_after_alloc = counting  # type: ignore[method-assign]
    seconds, n_steps, stored_blocks, n = 0.0, 0, 0, 0
    for wave in waves:
        for prompt in wave:
            sim.add(f"r{n}", prompt, max_tokens=4)
            n += 1
        while sim.scheduler.has_requests():
            t0 = clock()
            out = sim.scheduler.schedule()
            seconds += clock() - t0
            kv_out, blocks = report(out.kv_connector_metadata) if connector else (None, 0)
            stored_blocks += blocks
            ids = list(out.num_scheduled_tokens)
            reqs = {r: sim.requests[r].request for r in ids}
            done = [r for r in ids if reqs[r].num_computed_tokens >= reqs[r].num_tokens]
            runner = ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[7] if r in done else [] for r in ids],
                kv_connector_output=kv_out)
            t0 = clock()
            sim.scheduler.update_from_output(out, runner)
            seconds += clock() - t0
            n_steps += 1
            yield
        assert sim.scheduler.reset_prefix_cache(reset_connector=False)
    figures.update(seconds=seconds, steps=n_steps, hit_tokens=hits[0],
                   stored_bytes=stored_blocks * block_bytes)


CONFIGS = {
    "full": [SimGroup("full", 16, num_layers=4)],
    "full+swa128": [SimGroup("full", 16, num_layers=2), SimGroup("swa", 16, num_layers=2,
                                                              window=128)],
}
NATIVE = {"cpu_bytes_to_use": HOST_BYTES, "block_size": CHUNK}
KVTIER = {"host_bytes": HOST_BYTES, "chunk_tokens": CHUNK}
KVTIER_MODULE = "kvtier.integrations.vllm"
CONNECTORS = {
    "none": (None, None, {}, none_report),
    # prompts only: the pair the target is judged on (native's default)
    "native": ("OffloadingConnector", None, NATIVE, native_jobs_done),
    "kvtier": ("KvtierConnector", KVTIER_MODULE, {**KVTIER, "store": "prompt"}, kvtier_jobs_done),
    "kvtier-shared": ("KvtierConnector", KVTIER_MODULE,
                      {**KVTIER, "store": "prompt", "boundaries": "shared"}, kvtier_jobs_done),
    "kvtier-end": ("KvtierConnector", KVTIER_MODULE,
                   {**KVTIER, "store": "prompt", "boundaries": "end"}, kvtier_jobs_done),
    # prompts and answers (kvtier's default)
    "native-all": ("OffloadingConnector", None, {**NATIVE, "offload_prompt_only": False},
                   native_jobs_done),
    "kvtier-all": ("KvtierConnector", KVTIER_MODULE, {**KVTIER, "store": "all"},
                   kvtier_jobs_done),
    "kvtier-shared-all": ("KvtierConnector", KVTIER_MODULE,
                          {**KVTIER, "store": "all", "boundaries": "shared"}, kvtier_jobs_done),
}
#: kvtier row -> the native row it is judged against
PAIRS = {"kvtier": "native", "kvtier-shared": "native", "kvtier-end": "native",
         "kvtier-all": "native-all", "kvtier-shared-all": "native-all"}


def measure(groups: list[SimGroup], waves: list[list[list[int]]],
            clock: Callable[[], float]) -> dict[str, dict[str, Any]]:
    """Every configuration over the stream, interleaved step by step: each takes a step in
    turn, so that a slow spell of the machine falls on all of them alike (one after another,
    a spell of a few seconds decided which configuration came out ahead)."""
    per_layer_block = 2 * 16 * 1 * 8 * 2  # K and V, 16 tokens, 1 head of 8, fp16
    layers = sum(g.num_layers for g in groups) // len(groups)
    out: dict[str, dict[str, Any]] = {}
    running = []
    for name, (connector, module, extra, report) in CONNECTORS.items():
        sim = VllmSim(groups, connector or "OffloadingConnector", extra, module_path=module,
                      num_blocks=4096, worker=False) if connector else _bare(groups)
        out[name] = {}
        running.append(steps(sim, waves, report, per_layer_block * layers, clock, out[name]))
    gc.collect()  # the same start for every configuration (module docstring)
    order = random.Random(0)
    while running:  # in a new order each turn: none always runs after the same one
        order.shuffle(running)
        running = [r for r in running if next(r, StopIteration) is not StopIteration]
    return out


def _bare(groups: list[SimGroup]) -> VllmSim:
    sim = VllmSim(groups, "OffloadingConnector", {"cpu_bytes_to_use": HOST_BYTES,
                  "block_size": CHUNK}, module_path=None, num_blocks=4096, worker=False)
    sim.scheduler.connector = None
    return sim


FIGURES = ("ms_per_step", "overhead_ms_per_step", "overhead_ms_per_own_step", "hit_tokens",
           "stored_bytes", "steps")
TARGETS = {"overhead_ms_per_step": "kvtier <= native", "hit_tokens": "kvtier >= native",
           "stored_bytes": "kvtier <= native"}


def _meets(mine: dict[str, Any], base: dict[str, Any], target: str) -> bool:
    if target == "hit_tokens":
        return bool(mine[target] >= base[target])
    return bool(mine[target] <= base[target])


def _all_met(by_config: dict[str, dict[str, bool]]) -> bool:
    return all(all(targets.values()) for targets in by_config.values())


def _stream_row(config: str, figures: dict[str, Any]) -> Row:
    """The stream above as a parity row (prompts only, the pair the target is judged on)."""
    names = ("native", "kvtier", "kvtier-shared", "kvtier-end")
    return Row("document waves, prompts only", config,
               {n: figures[n]["hit_tokens"] for n in names},
               {n: figures[n]["stored_bytes"] for n in names})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer waves (CI)")
    parser.add_argument("--repeats", type=int,
                        help="runs of every configuration, the best taken (default 9, 3 quick)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: the scheduler thread's CPU time; wall: elapsed time")
    args = parser.parse_args(argv)
    waves = stream(0, 3 if args.quick else 8, 8)
    repeats = args.repeats or (3 if args.quick else 9)
    figures: dict[str, Any] = {}
    print(f"{'':<31} {'':>6} {'':>8} {'overhead ms/step':>19}")
    print(f"{'config':<12} {'connector':<18} {'steps':>6} {'ms/step':>8} {'stream':>9} "
          f"{'own':>9} {'hit tokens':>11} {'stored MiB':>11}")
    for cname, groups in CONFIGS.items():
        best: dict[str, dict[str, Any]] = {}
        for _ in range(repeats):  # best of N: the machine is shared and noisy
            for conn, r in measure(groups, waves, CLOCKS[args.clock]).items():
                if conn not in best or r["seconds"] < best[conn]["seconds"]:
                    best[conn] = r
        bare = best["none"]
        base = bare["seconds"] / bare["steps"]
        for conn, r in best.items():
            per = r["seconds"] / r["steps"]
            r["ms_per_step"], r["overhead_ms_per_own_step"] = per * 1e3, (per - base) * 1e3
            r["overhead_ms_per_step"] = (r["seconds"] - bare["seconds"]) / bare["steps"] * 1e3
            print(f"{cname:<12} {conn:<18} {r['steps']:>6} {per * 1e3:>8.3f} "
                  f"{r['overhead_ms_per_step']:>9.3f} {r['overhead_ms_per_own_step']:>9.3f} "
                  f"{r['hit_tokens']:>11} {r['stored_bytes'] / 2**20:>11.2f}")
        figures[cname] = {c: {k: r[k] for k in FIGURES} for c, r in best.items() if c != "none"}
    met = {name: {cname: {target: _meets(f[name], f[base], target) for target in TARGETS}
                  for cname, f in figures.items()} for name, base in PAIRS.items()}
    rows = parity_rows() + [_stream_row(cname, f) for cname, f in figures.items()]
    print("\nside by side, request by request (kvtier.integrations.vllm.parity):")
    print(render(rows))
    met_parity = {c: not shortfalls(rows, c) for c in ("kvtier", "kvtier-shared", "kvtier-end")}
    print(f"build: {describe()} (kvtier.buildinfo; README, \"Compiled build\")")
    print(json.dumps({"benchmark": "vllm_connector", "build": describe(), "clock": args.clock,
                      "figures": figures,
                      "targets": TARGETS,
                      "judged_on": "kvtier-end against native, prompts only (native's default"
                                   " and its storing rule); see the docstring",
                      "met": _all_met(met["kvtier-end"]),
                      "met_dense": _all_met(met["kvtier"]),
                      "met_shared": _all_met(met["kvtier-shared"]),
                      "met_all": _all_met(met["kvtier-all"]),
                      "met_shared_all": _all_met(met["kvtier-shared-all"]),
                      "met_by_target": met,
                      "parity": [vars(r) for r in rows],
                      "met_parity": met_parity}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
