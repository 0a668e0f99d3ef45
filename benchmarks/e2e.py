"""End to end on the reference engine: time to first token restored from the host tier, and
the cost of storing while decoding.

Run: ``python benchmarks/e2e.py [--tokens 8192] [--threads 1] [--repeat 3] [--quick]``.

* TTFT: an ``--tokens``-token prompt on a hybrid model (2 full-attention layers and 2
  sliding-window layers, window 512, hidden 256, 16-token blocks and chunks). Cold: the
  engine alone computes the whole prompt. Warm: an engine with a ``KvtierOffloader``
  whose device cache was just cleared restores the largest boundary from the host tier
  (stored by a cold run with kvtier attached, also timed: "cold, storing") and computes
  the rest. Each repeat uses a fresh prompt; runs alternate and each takes its best.
  Target: warm at most 0.2 of cold.
* Decode: 8 requests of 512-token prompts decode 96 tokens each, 8 at a time, on two
  engines stepping in turn (alternating order): the engine alone, and one with kvtier
  attached and storing prompts and answers, whose step is timed until its stores have
  finished (all of kvtier's work is charged to it). Tokens per second of the decode phase
  (after every request has its first token), totals over the repeats.
  Target: attached at least 0.97 of alone.

Both are ratios of runs in the same process, so the machine's load affects both sides.
Transfer bandwidth is in ``benchmarks/transfer.py``. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace

import torch

from kvtier.buildinfo import describe
from kvtier.engine import Engine, EngineConfig, GroupSpec
from kvtier.integrations.reference import KvtierOffloader

TTFT_TARGET = 0.2
DECODE_TARGET = 0.97
DECODE_REQUESTS, DECODE_PROMPT, DECODE_TOKENS = 8, 512, 96
HOST_BYTES = 1 << 30


def bench_config(max_tokens: int) -> EngineConfig:
    """The benchmark model: large enough that an 8k prefill takes seconds on a CPU."""
    groups = (
        GroupSpec("full", num_layers=2, tokens_per_block=16),
        GroupSpec("sliding_window", num_layers=2, tokens_per_block=16, window=512),
    )
    return EngineConfig(
        groups=groups, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
        intermediate_size=768, num_blocks=max_tokens // 16 + 16, max_prefill_tokens=512,
        max_running=DECODE_REQUESTS,
    )


def random_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def ttft(engine: Engine, prompt: list[int]) -> tuple[float, int]:
    """Seconds to the first token of a one-token request, and the tokens it restored."""
    start = time.perf_counter()
    [done] = engine.generate([prompt], max_tokens=1)
    return time.perf_counter() - start, done.num_restored_tokens


def measure_ttft(tokens: int, repeat: int) -> dict[str, float]:
    config = bench_config(tokens + 16)
    alone = Engine(config)
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    attached = Engine(config, offloader)
    rng = random.Random(0)
    ttft(alone, random_prompt(rng, 64))  # first-call costs off the clock
    ttft(attached, random_prompt(rng, 64))
    cold, storing, warm, hits = [], [], [], set()
    for _ in range(repeat):
        prompt = random_prompt(rng, tokens)
        cold.append(ttft(alone, prompt)[0])
        attached.reset_device_cache()
        storing.append(ttft(attached, prompt)[0])
        attached.reset_device_cache()  # the hit must come from kvtier's host tier
        seconds, hit = ttft(attached, prompt)
        warm.append(seconds)
        hits.add(hit)
    offloader.close()
    assert len(hits) == 1, f"hits differ between repeats: {hits}"
    best_cold, best_warm = min(cold), min(warm)
    return {"ttft_cold_s": best_cold, "ttft_cold_storing_s": min(storing),
            "ttft_warm_s": best_warm, "ttft_warm_over_cold": best_warm / best_cold,
            "ttft_hit_tokens": float(hits.pop())}


def decode_lockstep(
    engines: dict[str, Engine], offloader: KvtierOffloader, prompts: list[list[int]]
) -> dict[str, tuple[int, float]]:
    """Tokens decoded and seconds taken by each engine, the engines stepping in turn.

    Every request first gets its first token (prefill, not timed). Then the engines take
    one step each, in alternating order, so that the machine's load hits both alike. The
    attached engine's step is timed until its stores have finished (``drain``): all of
    kvtier's work is charged to it, and none of it runs during the other engine's step.
    """
    requests = {name: [e.get_request(e.add_request(p, DECODE_TOKENS)) for p in prompts]
                for name, e in engines.items()}
    for name, engine in engines.items():
        while not all(r.output_token_ids for r in requests[name]):
            engine.step()
    offloader.drain()
    first = {name: sum(len(r.output_token_ids) for r in rs) for name, rs in requests.items()}
    elapsed = dict.fromkeys(engines, 0.0)
    order = list(engines)
    while any(e.has_unfinished() for e in engines.values()):
        order.reverse()
        for name in order:
            start = time.perf_counter()
            engines[name].step()
            if name == "attached":
                offloader.drain()
            elapsed[name] += time.perf_counter() - start
    return {name: (sum(len(r.output_token_ids) for r in rs) - first[name], elapsed[name])
            for name, rs in requests.items()}


def measure_decode(repeat: int) -> dict[str, float]:
    config = bench_config(DECODE_PROMPT + DECODE_TOKENS + 16)
    config = replace(config, num_blocks=config.num_blocks * DECODE_REQUESTS)
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    engines = {"detached": Engine(config), "attached": Engine(config, offloader)}
    rng = random.Random(1)
    tokens, seconds = dict.fromkeys(engines, 0), dict.fromkeys(engines, 0.0)
    for _ in range(repeat):
        prompts = [random_prompt(rng, DECODE_PROMPT) for _ in range(DECODE_REQUESTS)]
        for name, (n, t) in decode_lockstep(engines, offloader, prompts).items():
            tokens[name] += n
            seconds[name] += t
    stored = offloader.metrics.chunks_stored
    offloader.close()
    assert stored > 0, "kvtier stored nothing while attached"
    detached = tokens["detached"] / seconds["detached"]
    attached = tokens["attached"] / seconds["attached"]
    return {"decode_detached_tok_s": detached, "decode_attached_tok_s": attached,
            "decode_attached_over_detached": attached / detached}


def report(f: dict[str, float], tokens: int, threads: int) -> None:
    print(f"reference engine on the CPU, {threads} torch thread(s)\n")
    print(f"{'figure':<44}{'value':>12}")
    rows = [
        (f"TTFT cold, {tokens} tokens, engine alone", f"{f['ttft_cold_s'] * 1e3:.0f} ms"),
        ("TTFT cold, kvtier attached and storing", f"{f['ttft_cold_storing_s'] * 1e3:.0f} ms"),
        (f"TTFT warm, {f['ttft_hit_tokens']:.0f} tokens from host",
         f"{f['ttft_warm_s'] * 1e3:.0f} ms"),
        (f"warm / cold (target <= {TTFT_TARGET})", f"{f['ttft_warm_over_cold']:.3f}"),
        ("decode, engine alone", f"{f['decode_detached_tok_s']:.0f} tok/s"),
        ("decode, kvtier attached and storing", f"{f['decode_attached_tok_s']:.0f} tok/s"),
        (f"attached / alone (target >= {DECODE_TARGET})",
         f"{f['decode_attached_over_detached']:.3f}"),
    ]
    for name, value in rows:
        print(f"{name:<44}{value:>12}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192, help="TTFT prompt length")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind")
    parser.add_argument("--quick", action="store_true",
                        help="a 2048-token prompt, one run of each kind (CI)")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.repeat = min(args.tokens, 2048), 1
    torch.set_num_threads(args.threads)
    figures = {**measure_ttft(args.tokens, args.repeat), **measure_decode(args.repeat)}
    report(figures, args.tokens, args.threads)
    targets = {"ttft_warm_over_cold": TTFT_TARGET,
               "decode_attached_over_detached": DECODE_TARGET}
    met = (figures["ttft_warm_over_cold"] <= TTFT_TARGET
           and figures["decode_attached_over_detached"] >= DECODE_TARGET)
    print(f"build: {describe()} (kvtier.buildinfo; README, \"Compiled build\")")
    print(json.dumps({"benchmark": "e2e", "build": describe(), "figures": figures,
                      "targets": targets, "met": met}))


if __name__ == "__main__":
    main()
