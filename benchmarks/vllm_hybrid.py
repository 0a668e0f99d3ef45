"""The recurrent-state hybrid of ``vllm_engine.py --model qwen3next``: time to first token.

A random-weight Qwen3-Next-class model (gated-delta-net linear attention and full attention,
alternating; written here with transformers, no hub) served by vLLM's CPU engine with prefix
caching and ``mamba_cache_mode="align"``, and ``KvtierConnector`` on its default options:
vLLM gives both groups 1152-token blocks and kvtier's default chunk is one block, so a hit
ends at the last multiple of 1152 below the prompt's last token, in kvtier as in vLLM's own
prefix cache. The turns are ``vllm_engine.ttft_turn``'s: cold, warm from kvtier (vLLM's
cache reset: one state chunk and the attention chunks loaded), and a hit in vLLM's own
cache. Targets: kvtier/cold <= 0.3, kvtier/vllm-hit <= 1.5. No decoding comparison here
(``vllm_engine.py`` measures that on attention). Runs as ``python benchmarks/vllm_hybrid.py
[--quick] [--prompt-tokens N] [--turns N]`` or as ``vllm_engine.py --model qwen3next``; its
last line is one JSON object (``"benchmark": "vllm_hybrid"``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvtier.buildinfo import describe
from ttft_figures import ttft_figures
from vllm import LLM

TARGETS = {"ttft_kvtier_over_cold": 0.3, "ttft_kvtier_over_vllm_hit": 1.5}
LAYERS, HIDDEN = 8, 512
BLOCK_TOKENS = 1152
"""What vLLM picks for this model: the attention page (2 KV heads of 32, bf16) grown until
it holds one layer's padded state (conv 3 x 1024 bf16, delta-net 4 x 128 x 128 fp32)."""


def write_model(folder: Path) -> Path:
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    config = Qwen3NextConfig(
        hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=4096,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=128,
        linear_value_head_dim=128, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=HIDDEN, shared_expert_intermediate_size=HIDDEN,
        layer_types=["linear_attention", "full_attention"] * (LAYERS // 2),
        max_position_embeddings=16384, initializer_range=0.2)
    Qwen3NextForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return folder


def start(model: Path, max_len: int, options: dict[str, Any]) -> LLM:
    """The engine with ``KvtierConnector`` on its defaults (no ``chunk_tokens``), and
    ``options`` (``vllm_engine.py --connector-option``)."""
    transfer = {"kv_connector": "KvtierConnector",
                "kv_connector_module_path": "kvtier.integrations.vllm", "kv_role": "kv_both",
                "kv_connector_extra_config": {"host_bytes": 512 << 20, **options}}
    return LLM(model=str(model), skip_tokenizer_init=True, dtype="bfloat16", seed=0,
               max_model_len=max_len, enforce_eager=True, distributed_executor_backend="uni",
               kv_cache_memory_bytes=256 << 20, enable_prefix_caching=True,
               mamba_cache_mode="align", kv_transfer_config=transfer)


def run(args: argparse.Namespace, ttft_turn: Callable[[LLM, int, int], dict[str, float]],
        timed: Callable[..., Any], stop: Callable[[LLM], None],
        options: dict[str, Any] | None = None) -> None:
    """The benchmark with ``vllm_engine``'s turn, timing and shutdown (passed in: this
    module is imported by it). ``--quick``: 2 turns of 2600-token prompts."""
    n, turns = (2600, 2) if args.quick else (args.prompt_tokens, args.turns)
    with tempfile.TemporaryDirectory() as tmp:
        llm = start(write_model(Path(tmp) / "qwen3next"), n + BLOCK_TOKENS, options or {})
        timed(llm, [_warmup()], 4)  # first-call costs are not the engine's
        results = [ttft_turn(llm, turn, n) for turn in range(turns)]
        stop(llm)
    figures = report(results, n, turns)
    met = all(figures[k] <= bound for k, bound in TARGETS.items())
    met = met and figures["kvtier_hit_tokens"] >= figures["vllm_hit_tokens"] > 0
    print(json.dumps({"benchmark": "vllm_hybrid", "model": "qwen3next", "build": describe(),
                      "figures": figures, "targets": TARGETS, "met": met}))


def _warmup() -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(range(3, 300)))


def report(results: list[dict[str, float]], n: int, turns: int) -> dict[str, Any]:
    """Print the table; return the figures (``ttft_figures``: medians of per-turn ratios,
    the warm ratio counterbalanced over which warm run went first)."""
    figures: dict[str, Any] = {"prompt_tokens": n, **ttft_figures(results)}
    print(f"vLLM CPU engine, Qwen3-Next-class {LAYERS} layers (GDN + full) x {HIDDEN} hidden, "
          f"{BLOCK_TOKENS}-token blocks, {n}-token prompts, {turns} turns; build: {describe()}")
    print(f"{'time to first token':<28}{'median s':>10}{'hit tokens':>12}")
    print(f"{'  cold':<28}{figures['ttft_cold_s']:>10.3f}{0:>12}")
    print(f"{'  warm from kvtier':<28}{figures['ttft_kvtier_s']:>10.3f}"
          f"{figures['kvtier_hit_tokens']:>12.0f}")
    print(f"{'  vLLM prefix-cache hit':<28}{figures['ttft_vllm_hit_s']:>10.3f}"
          f"{figures['vllm_hit_tokens']:>12.0f}")
    print(f"{'ratio':<34}{'median':>8}{'target':>10}")
    for name, bound in TARGETS.items():
        print(f"  {name:<32}{figures[name]:>8.3f}{'<=':>6} {bound}")
    return figures


def main() -> None:
    """Standalone: the turns, timing and shutdown are ``vllm_engine``'s (imported here, not
    at the top: ``vllm_engine`` imports this module)."""
    import vllm_engine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 turns, 2600-token prompts")
    run(parser.parse_args(), vllm_engine.ttft_turn, vllm_engine.timed, vllm_engine.stop)


if __name__ == "__main__":
    main()
