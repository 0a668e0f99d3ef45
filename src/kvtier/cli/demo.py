"""``kvtier demo``: a multi-turn conversation through the reference engine, cold and warm.

Each turn's prompt is the previous turn's prompt and answer plus new user tokens. Every
turn runs twice on the same weights:

* cold: an engine without kvtier computes the whole prompt;
* warm: an engine with a ``KvtierOffloader`` whose device cache was just cleared, so any
  hit comes from kvtier's host tier, stored by the previous warm turns (prompt and answer).

Per turn it prints the time to first token of both, the tokens restored, the bytes kvtier
loaded and stored, and whether the warm answer equals the cold one (same tokens, logits
within fp32 rounding). The exit status is 1 if any turn differs.

Example (a 2-core CPU; times vary from run to run)::

    $ kvtier demo
    turn  prompt  hit  cold TTFT  warm TTFT  speedup  loaded     stored     identical
    1     96      0    14.1 ms    25.6 ms    0.55x    0 B        192.0 KiB  yes
    2     208     96   31.4 ms    21.9 ms    1.43x    144.0 KiB  224.0 KiB  yes
    3     320     208  46.1 ms    27.3 ms    1.69x    256.0 KiB  224.0 KiB  yes
    4     432     320  76.2 ms    29.2 ms    2.61x    368.0 KiB  224.0 KiB  yes

On turn 1 nothing is stored yet, so the warm run pays for storing and gains nothing.

Needs the ``torch`` extra; without it the command says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvtier.cli.common import (
    INT64_MAX,
    MAX_MTP_MODULES,
    MAX_SPEC_TOKENS,
    Command,
    UsageError,
    human_bytes,
    int_in,
    parse_bytes,
    positive_int,
    print_json,
    table,
)

if TYPE_CHECKING:
    from kvtier.engine import Completion, Engine, EngineConfig, GroupSpec
    from kvtier.integrations.reference import KvtierOffloader

MAX_CONVERSATION_TOKENS = 16384
"""The longest conversation the demo runs (turns x (user tokens + answer tokens))."""
MAX_THREADS = 1024
"""The most torch intra-op threads ``--threads`` takes."""


@dataclass(frozen=True)
class DemoLayout:
    """A named reference-engine layout: what it is, and its groups (built lazily: torch)."""

    help: str
    groups: Callable[[], tuple[GroupSpec, ...]]


def _full() -> tuple[GroupSpec, ...]:
    from kvtier.engine import GroupSpec

    return (GroupSpec("full", num_layers=4, tokens_per_block=16),)


def _hybrid(extra: int = 0) -> tuple[GroupSpec, ...]:
    from kvtier.engine import GroupSpec

    return (
        GroupSpec("full", num_layers=2, tokens_per_block=16),
        GroupSpec("sliding_window", num_layers=2, tokens_per_block=16, window=40,
                  extra_retained=extra),
    )


def _local() -> tuple[GroupSpec, ...]:
    from kvtier.engine import GroupSpec

    return (
        GroupSpec("full", num_layers=1, tokens_per_block=16),
        GroupSpec("chunked_local", num_layers=3, tokens_per_block=16, chunk=96),
    )


def _mixed_blocks() -> tuple[GroupSpec, ...]:
    from kvtier.engine import GroupSpec

    return (
        GroupSpec("full", num_layers=2, tokens_per_block=16, blocks_per_chunk=2),
        GroupSpec("sliding_window", num_layers=2, tokens_per_block=8, blocks_per_chunk=2,
                  window=24),
    )


LAYOUTS: dict[str, DemoLayout] = {
    "full": DemoLayout("4 full-attention layers, 16-token blocks", _full),
    "hybrid": DemoLayout("2 full + 2 sliding-window layers (window 40)", _hybrid),
    "mtp": DemoLayout("hybrid, keeping 3 extra tokens for MTP (E = 3)", lambda: _hybrid(3)),
    "local": DemoLayout("1 full + 3 chunked-local layers (chunk 96)", _local),
    "mixed-blocks": DemoLayout("full on 16-token blocks, window 24 on 8-token blocks",
                               _mixed_blocks),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = ", ".join(f"{k} ({v.help})" for k, v in LAYOUTS.items())
    parser.add_argument("--turns", type=positive_int, default=4, metavar="N",
                        help="conversation turns (default 4)")
    parser.add_argument("--user-tokens", type=positive_int, default=96, metavar="N",
                        help="new user tokens each turn (default 96)")
    parser.add_argument("--tokens", type=positive_int, default=16, metavar="N",
                        help="answer tokens generated each turn (default 16)")
    parser.add_argument("--layout", choices=list(LAYOUTS), default="hybrid", metavar="NAME",
                        help=f"engine layout: {names} (default hybrid)")
    parser.add_argument("--seed", type=int_in(0, INT64_MAX), default=0,
                        help="seed of weights and tokens (an integer >= 0)")
    parser.add_argument("--host-bytes", type=parse_bytes, default=parse_bytes("256MiB"),
                        metavar="SIZE", help="kvtier host tier size (default 256MiB)")
    parser.add_argument("--threads", type=int_in(1, MAX_THREADS), default=1, metavar="N",
                        help="torch intra-op threads (default 1: the model is small, and on a "
                             "busy machine idle threads spin)")
    parser.add_argument("--speculative", choices=["none", "mtp", "eagle"], default="none",
                        help="speculative decoding: multi-module MTP or EAGLE draft layers "
                             "(default none); adds acceptance columns")
    parser.add_argument("--spec-tokens", type=int_in(1, MAX_SPEC_TOKENS), default=4,
                        metavar="K", help="draft tokens verified per step (default 4, at most "
                                          f"{MAX_SPEC_TOKENS}; MTP keeps E = K - 1)")
    parser.add_argument("--mtp-modules", type=int_in(1, MAX_MTP_MODULES), default=2,
                        metavar="M",
                        help=f"MTP draft modules (default 2, at most {MAX_MTP_MODULES})")
    parser.add_argument("--force-rejections", action="store_true",
                        help="replace every draft by a wrong token (drives the rejection path)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def speculative_from_args(args: argparse.Namespace) -> Any:
    """The engine's ``SpeculativeConfig`` for ``--speculative``, or None."""
    if args.speculative == "none":
        return None
    from kvtier.engine.speculative_config import SpeculativeConfig

    modules = args.mtp_modules if args.speculative == "mtp" else 1
    try:
        return SpeculativeConfig(args.speculative, args.spec_tokens, modules,
                                 force_rejections=args.force_rejections)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError(
            "the demo runs the reference engine, which needs torch: install the torch extra "
            "(pip install 'kvtier[torch]')"
        ) from None


def demo_config(layout: str, seed: int, max_tokens: int, speculative: Any = None) -> EngineConfig:
    """The engine config of a named layout, with blocks for a ``max_tokens`` conversation.

    Example: ``demo_config("hybrid", 0, 500)`` has 33 blocks of 16 tokens per group.
    """
    from kvtier.engine import EngineConfig

    groups = LAYOUTS[layout].groups()
    if speculative is not None:
        max_tokens += speculative.num_speculative_tokens + 16  # drafts and the hidden tail
    smallest = min(g.tokens_per_block for g in groups)
    return EngineConfig(
        groups=groups, hidden_size=256, num_heads=8, num_kv_heads=2, head_dim=32,
        intermediate_size=768, seed=seed, num_blocks=-(-max_tokens // smallest) + 1,
        max_prefill_tokens=64, max_running=1, speculative=speculative,
    )


def timed_generate(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[float, Completion]:
    """Run one request to the end; the seconds until its first token, and its completion."""
    start = time.perf_counter()
    rid = engine.add_request(prompt, max_tokens)
    request = engine.get_request(rid)
    ttft: float | None = None
    done: list[Completion] = []
    while engine.has_unfinished():
        done += engine.step()
        if ttft is None and request.output_token_ids:
            ttft = time.perf_counter() - start
    assert ttft is not None and len(done) == 1
    return ttft, done[0]


def same_generation(warm: Completion, cold: Completion) -> bool:
    """Same tokens, and logits equal within fp32 rounding."""
    import torch

    return warm.output_token_ids == cold.output_token_ids and bool(
        torch.allclose(warm.logits, cold.logits, rtol=1e-5, atol=1e-5)
    )


def converse(args: argparse.Namespace) -> dict[str, Any]:
    """Run the conversation; the report as plain data (the ``--json`` object)."""
    import torch

    from kvtier.engine import Engine
    from kvtier.integrations.reference import KvtierOffloader

    total = args.turns * (args.user_tokens + args.tokens)
    if total > MAX_CONVERSATION_TOKENS:
        raise UsageError(
            f"the conversation would reach {total} tokens; keep turns x (user tokens + "
            f"tokens) <= {MAX_CONVERSATION_TOKENS}"
        )
    speculative = speculative_from_args(args)
    config = demo_config(args.layout, args.seed, total, speculative)
    try:
        offloader = KvtierOffloader.for_engine(config, host_bytes=args.host_bytes)
    except ValueError as e:
        raise UsageError(f"--host-bytes {human_bytes(args.host_bytes)}: {e}") from None
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        with offloader:
            cold_engine, warm_engine = Engine(config), Engine(config, offloader)
            for engine in (cold_engine, warm_engine):
                timed_generate(engine, [0], 1)  # first-call costs off the clock
            turns = _turns(args, cold_engine, warm_engine, offloader)
    finally:
        torch.set_num_threads(threads)
    return {"layout": args.layout, "model": config.model_id,
            "speculative": args.speculative, "turns": turns}


def _turns(args: argparse.Namespace, cold_engine: Engine, warm_engine: Engine,
           offloader: KvtierOffloader) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    vocab = cold_engine.config.vocab_size
    history: list[int] = []
    turns = []
    for turn in range(1, args.turns + 1):
        prompt = history + [rng.randrange(vocab) for _ in range(args.user_tokens)]
        ttft_cold, cold = timed_generate(cold_engine, prompt, args.tokens)
        warm_engine.reset_device_cache()  # any hit now comes from kvtier's host tier
        before = _moved(offloader)
        ttft_warm, warm = timed_generate(warm_engine, prompt, args.tokens)
        after = _moved(offloader)
        turns.append({
            "turn": turn, "prompt_tokens": len(prompt), "hit_tokens": warm.num_restored_tokens,
            "identical": same_generation(warm, cold),
            "ttft_cold_s": ttft_cold, "ttft_warm_s": ttft_warm,
            "bytes_loaded": after[0] - before[0], "bytes_stored": after[1] - before[1],
            **_acceptance("cold", cold), **_acceptance("warm", warm),
        })
        history = prompt + list(cold.output_token_ids)
    return turns


def _acceptance(run: str, c: Completion) -> dict[str, Any]:
    """Drafted, accepted and rejected tokens of one run, and its acceptance rate."""
    return {f"{run}_drafted": c.num_drafted_tokens, f"{run}_accepted": c.num_accepted_tokens,
            f"{run}_rejected": c.num_rejected_tokens, f"{run}_acceptance": c.acceptance_rate}


def _moved(offloader: KvtierOffloader) -> tuple[int, int]:
    """Bytes kvtier has loaded and stored so far."""
    return offloader.metrics.bytes_loaded, offloader.metrics.bytes_stored


def render(report: dict[str, Any]) -> str:
    rows = [
        [t["turn"], t["prompt_tokens"], t["hit_tokens"], f"{t['ttft_cold_s'] * 1e3:.1f} ms",
         f"{t['ttft_warm_s'] * 1e3:.1f} ms", f"{t['ttft_cold_s'] / t['ttft_warm_s']:.2f}x",
         human_bytes(t["bytes_loaded"]), human_bytes(t["bytes_stored"]),
         "yes" if t["identical"] else "NO"]
        for t in report["turns"]
    ]
    headers = ["turn", "prompt", "hit", "cold TTFT", "warm TTFT", "speedup", "loaded",
               "stored", "identical"]
    if report.get("speculative", "none") != "none":
        headers += ["drafted", "accepted cold/warm", "rejected warm"]
        for row, t in zip(rows, report["turns"], strict=True):
            row += [t["warm_drafted"], f"{t['cold_acceptance']:.2f}/{t['warm_acceptance']:.2f}",
                    t["warm_rejected"]]
    head = (f"layout {report['layout']} ({LAYOUTS[report['layout']].help}), "
            f"model {report['model']}")
    return head + "\n\n" + table(headers, rows)


def run(args: argparse.Namespace) -> int:
    _require_torch()
    report = converse(args)
    if args.json:
        print_json(report)
    else:
        print(render(report))
    return 0 if all(t["identical"] for t in report["turns"]) else 1


COMMAND = Command(
    "demo",
    "Run a multi-turn conversation through the reference engine, cold and restored by kvtier.",
    add_arguments, run,
)
