"""Speculative decoding end to end: MTP and EAGLE restored through the real offloader.

Draft groups have a lookahead and a recomputed tail (``kvtier.engine.speculative_config``): a hit
at ``b`` restores target groups to ``b``, draft groups to their restore point (the last
chunk keyed by tokens before ``b``), and the ``hidden`` state block of ``[b - T, b)`` from
which the engine recomputes the draft tail.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from e2e_helpers import HOST_BYTES, expected_hit, prompt

from kvtier import coverage
from kvtier.engine import Completion, Engine, EngineConfig, GroupSpec
from kvtier.engine.speculative_config import SpeculativeConfig
from kvtier.integrations.reference import KvtierOffloader
from kvtier.planner import Planner, TransferJob

Loads = dict[str, list[int]]


class RecordingPlanner:
    """The offloader's planner, with each accepted hit's load job recorded (a wrapper, not a
    patch: the compiled build's planner methods cannot be replaced on an instance)."""

    def __init__(self, planner: Planner, names: list[str]) -> None:
        self._planner, self._names = planner, names
        self.jobs: list[Loads] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._planner, name)

    def accept_hit(self, request_id: str, block_tables: object) -> TransferJob:
        job = self._planner.accept_hit(request_id, block_tables)  # type: ignore[arg-type]
        loads: dict[str, list[int]] = defaultdict(list)
        for copy in job.copies:
            loads[self._names[copy.group]].append(copy.chunk)
        self.jobs.append({name: sorted(chunks) for name, chunks in loads.items()})
        return job


def record_loads(offloader: KvtierOffloader) -> list[Loads]:
    """Per accepted hit, the chunks loaded, by group name (the planner's load jobs)."""
    recorder = RecordingPlanner(offloader.planner, [g.name for g in offloader.layout.groups])
    offloader.planner = recorder  # type: ignore[assignment]
    return recorder.jobs


def seed_config(force_rejections: bool = False) -> EngineConfig:
    """The first seed: window 32 (E = 3 from MTP k = 4), two modules, 16-token blocks."""
    groups = (GroupSpec("full", tokens_per_block=16),
              GroupSpec("sliding_window", tokens_per_block=16, window=32))
    spec = SpeculativeConfig("mtp", num_speculative_tokens=4, num_modules=2,
                             force_rejections=force_rejections)
    return EngineConfig(groups=groups, speculative=spec, max_prefill_tokens=32, num_blocks=24)


def cold_and_warm(config: EngineConfig, prompts: list[list[int]], max_tokens: int,
                  warm_config: EngineConfig | None = None,
                  ) -> tuple[list[Completion], list[Completion], list[Loads]]:
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    loads = record_loads(offloader)
    cold = Engine(config, offloader).generate(prompts, max_tokens)
    warm = Engine(warm_config or config, offloader).generate(prompts, max_tokens)
    return cold, warm, loads


def assert_same(warm: Completion, cold: Completion) -> None:
    assert warm.output_token_ids == cold.output_token_ids
    assert (warm.num_drafted_tokens, warm.num_accepted_tokens) == (
        cold.num_drafted_tokens, cold.num_accepted_tokens)


SEED_LOADS = {"g0-full": [0, 1, 2, 3], "g1-sliding_window": [1, 2, 3],
              "mtp1": [0, 1, 2], "mtp2": [0, 1, 2], "hidden": [3]}


def test_seed_configuration_restores_64_tokens_with_the_retained_window_chunk() -> None:
    config = seed_config()
    layout = config.layout()
    assert layout.groups[1].extra_retained == 3
    [cold], [warm], loads = cold_and_warm(config, [list(range(10, 75))], max_tokens=16)
    assert len(cold.prompt_token_ids) == 65 and len(cold.output_token_ids) == 16
    assert cold.num_restored_tokens == 0 and warm.num_restored_tokens == 64
    assert_same(warm, cold)
    assert loads == [SEED_LOADS]  # sliding chunk 1 holds retained tokens 30 and 31
    assert cold.num_drafted_tokens > 0


def test_seed_configuration_with_forced_rejections_runs_the_rejection_path() -> None:
    # The cold run records without rejections; the warm run forces them after the restore.
    [cold], [warm], loads = cold_and_warm(seed_config(), [list(range(10, 75))], 16,
                                          warm_config=seed_config(force_rejections=True))
    assert warm.num_restored_tokens == 64 and loads == [SEED_LOADS]
    assert warm.output_token_ids == cold.output_token_ids
    assert warm.num_accepted_tokens == 0 and warm.num_rejected_tokens == warm.num_drafted_tokens
    # every step rewound module 2 and re-prefilled k - 1 = 3 draft positions
    assert warm.num_reprefilled_tokens == 3 * (warm.num_drafted_tokens // 4)
    assert warm.num_reprefilled_tokens > 0


def small(spec: SpeculativeConfig) -> EngineConfig:
    """Full + window 10 on 4-token blocks, 8-token chunks."""
    groups = (GroupSpec("full", tokens_per_block=4, blocks_per_chunk=2),
              GroupSpec("sliding_window", tokens_per_block=4, blocks_per_chunk=2, window=10))
    return EngineConfig(groups=groups, speculative=spec, max_prefill_tokens=5, num_blocks=96)


SPECS = {
    "mtp-k1": SpeculativeConfig("mtp", 1, 1),
    "mtp-k2": SpeculativeConfig("mtp", 2, 2),
    "mtp-k4": SpeculativeConfig("mtp", 4, 2),
    "eagle-k3": SpeculativeConfig("eagle", 3),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_differential_matrix_same_tokens_and_acceptance_after_a_hit(name: str) -> None:
    config = small(SPECS[name])
    lengths = (16, 17, 25)
    prompts = [prompt(n, salt) for salt, n in enumerate(lengths)]
    cold, warm, _ = cold_and_warm(config, prompts, max_tokens=8)
    for n, c, w in zip(lengths, cold, warm, strict=True):
        assert w.num_restored_tokens == expected_hit(config, n) > 0
        assert_same(w, c)
    assert sum(c.num_accepted_tokens for c in cold) > 0  # acceptance is not vacuous


def test_a_consumer_diverging_after_a_chunk_boundary_uses_no_draft_chunk_past_it() -> None:
    config = seed_config()
    producer = list(range(10, 75))
    consumer = [*producer[:64], 200, 201, 202]  # diverges at token 64, right after chunk 3
    offloader = KvtierOffloader.for_engine(config, host_bytes=HOST_BYTES)
    Engine(config, offloader).generate([producer], 16)
    loads = record_loads(offloader)
    [warm] = Engine(config, offloader).generate([consumer], 16)
    [alone] = Engine(config).generate([consumer], 16)
    assert warm.num_restored_tokens == 64
    assert_same(warm, alone)
    layout = config.layout()
    for group in layout.groups:
        for chunk in loads[0].get(group.name, []):
            assert (chunk + 1) * group.tokens_per_chunk + group.lookahead <= 64
    assert all(coverage.restore_point(g, 64) == 48 for g in layout.groups if g.lookahead)
