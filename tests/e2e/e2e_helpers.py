"""Engine layouts, prompts and run helpers for the differential end-to-end tests.

Every test runs the reference engine with the real ``KvtierOffloader`` (planner, host
``ChunkStore``, transfer engine), cold and then restored, and compares the two.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvtier import coverage
from kvtier.engine import Completion, Engine, EngineConfig, GroupSpec
from kvtier.integrations.reference import KvtierOffloader
from kvtier.transfer import ChunkCopy

HOST_BYTES = 8 << 20
MAX_TOKENS = 3


def _config(*groups: GroupSpec, **overrides: object) -> EngineConfig:
    # max_prefill_tokens 5 divides no boundary: the restored run computes other pieces
    # than the cold one, so logits agree within fp32 rounding, not bit for bit.
    settings: dict[str, object] = {"max_prefill_tokens": 5, "num_blocks": 96, **overrides}
    return EngineConfig(groups=groups, **settings)  # type: ignore[arg-type]


def full_only() -> EngineConfig:
    return _config(GroupSpec("full", num_layers=2, tokens_per_block=4, blocks_per_chunk=2))


def full_and_window(extra: int) -> EngineConfig:
    """Window 10 with 8-token chunks: the window is not a multiple of the chunk."""
    return _config(
        GroupSpec("full", num_layers=1, tokens_per_block=4, blocks_per_chunk=2),
        GroupSpec("sliding_window", num_layers=2, tokens_per_block=4, blocks_per_chunk=2,
                  window=10, extra_retained=extra),
    )


def chunked_local() -> EngineConfig:
    """Attention chunk 12 with 8-token kvtier chunks: local chunks straddle stored ones."""
    return _config(
        GroupSpec("full", num_layers=1, tokens_per_block=4, blocks_per_chunk=2),
        GroupSpec("chunked_local", num_layers=2, tokens_per_block=4, blocks_per_chunk=2,
                  chunk=12),
    )


def block_sizes_per_group() -> EngineConfig:
    """8-token blocks (16-token chunks) next to 2-token blocks (4-token chunks), W = 5."""
    return _config(
        GroupSpec("full", num_layers=1, tokens_per_block=8, blocks_per_chunk=2),
        GroupSpec("sliding_window", num_layers=2, tokens_per_block=2, blocks_per_chunk=2,
                  window=5, extra_retained=1),
    )


def three_groups() -> EngineConfig:
    """Full, window 6 and local chunk 6 on 4-token chunks, hits every 16 tokens."""
    return _config(
        GroupSpec("full", num_layers=1, tokens_per_block=4, blocks_per_chunk=1),
        GroupSpec("sliding_window", num_layers=1, tokens_per_block=4, window=6,
                  extra_retained=1),
        GroupSpec("chunked_local", num_layers=1, tokens_per_block=4, chunk=6),
        hit_granularity=16,
    )


def full_and_state() -> EngineConfig:
    """Full attention next to two recurrent layers (a ``state`` group), both 8-token chunks:
    the Qwen3-Next shape, one state kept per block boundary."""
    return _config(
        GroupSpec("full", num_layers=1, tokens_per_block=4, blocks_per_chunk=2),
        GroupSpec("state", num_layers=2, tokens_per_block=4, blocks_per_chunk=2),
    )


def window_and_state() -> EngineConfig:
    """Sliding window 10 (``E = 1``) next to a recurrent layer: no group keeps the prefix."""
    return _config(
        GroupSpec("sliding_window", num_layers=1, tokens_per_block=4, blocks_per_chunk=2,
                  window=10, extra_retained=1),
        GroupSpec("state", num_layers=1, tokens_per_block=4, blocks_per_chunk=2),
    )


def state_blocks() -> EngineConfig:
    """16-token full chunks over 8-token state blocks: only every other state is needed."""
    return _config(
        GroupSpec("full", num_layers=1, tokens_per_block=4, blocks_per_chunk=4),
        GroupSpec("state", num_layers=1, tokens_per_block=8),
    )


def state_per_token() -> EngineConfig:
    """A state kept after every token: the one state layout that allows whole-prompt hits."""
    return _config(
        GroupSpec("full", num_layers=1, tokens_per_block=4, blocks_per_chunk=2),
        GroupSpec("state", num_layers=1, tokens_per_block=1),
    )


HYBRIDS: dict[str, Callable[[], EngineConfig]] = {
    "full-state": full_and_state,
    "window-state": window_and_state,
    "state-blocks": state_blocks,
    "state-per-token": state_per_token,
}

LAYOUTS: dict[str, Callable[[], EngineConfig]] = {
    "full": full_only,
    "window-E0": lambda: full_and_window(0),
    "window-E1": lambda: full_and_window(1),
    "window-E3": lambda: full_and_window(3),
    "chunked-local": chunked_local,
    "block-sizes": block_sizes_per_group,
    "three-groups": three_groups,
    **HYBRIDS,
}


def edge_lengths(config: EngineConfig) -> list[int]:
    """Prompt lengths at, just below and just above chunk and boundary multiples.

    Example: 4-token chunks and hits every 16 tokens: 3, 4, 5, 15, 16, 17, 31, 32, 33, ...
    """
    layout = config.layout()
    g = layout.hit_granularity
    chunk = min(group.tokens_per_chunk for group in layout.groups)
    marks = {chunk, g, 2 * g, 3 * g}
    return sorted({m + d for m in marks for d in (-1, 0, 1) if m + d >= 1})


def expected_hit(config: EngineConfig, prompt_tokens: int, shared: int | None = None) -> int:
    """The hit of the largest consumer-admissible boundary (<= ``shared`` shared tokens):
    the boundary, or ``prompt - 1`` for a prompt that ends on one (its whole-prompt hit)."""
    bounds = coverage.admissible_boundaries(config.layout(), prompt_tokens, prompt_tokens)
    return max((coverage.consumer_hit(b, prompt_tokens) for b in bounds
                if shared is None or b <= shared), default=0)


def expected_chunks(config: EngineConfig, hit: int) -> int:
    """Chunks a hit at ``hit`` loads into an empty device cache, every group together."""
    return sum(len(coverage.load_set(g, hit)) for g in config.layout().groups)


def prompt(length: int, salt: int = 0) -> list[int]:
    """A deterministic prompt of token ids in [0, 256)."""
    return [(i * 37 + salt * 101 + (i * i) % 13) % 256 for i in range(length)]


def run(engine: Engine, prompts: list[list[int]], max_tokens: int = MAX_TOKENS) -> list[Completion]:
    return engine.generate(prompts, max_tokens=max_tokens)


def assert_same_generation(warm: Completion, cold: Completion) -> None:
    """Same tokens, logits equal within fp32 rounding."""
    assert warm.output_token_ids == cold.output_token_ids
    torch.testing.assert_close(warm.logits, cold.logits, rtol=1e-5, atol=1e-5)


def cold_then_reset(
    config: EngineConfig, prompts: list[list[int]], offloader: KvtierOffloader | None = None
) -> tuple[list[Completion], list[Completion], KvtierOffloader]:
    """Generate cold, clear the engine's device cache (kvtier's tiers stay), generate again."""
    offloader = offloader or KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    engine = Engine(config, offloader)
    cold = run(engine, prompts)
    engine.reset_device_cache()
    warm = run(engine, prompts)
    return cold, warm, offloader


class Faults:
    """A transfer fault hook that fails every copy while armed."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self, copy: ChunkCopy) -> None:
        if self.armed:
            raise OSError("injected transfer fault")
