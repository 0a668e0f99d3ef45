"""A recurrent-state hybrid inside the real vLLM engine: a tiny Qwen3-Next (gated delta net
linear attention plus full attention, ``tiny_models.qwen3next``) served with kvtier's
connector on its default options, with prefix caching and ``mamba_cache_mode="align"``.

vLLM gives both groups 1152-token blocks here, so kvtier's default chunk is 1152 tokens and
a hit ends only at a multiple of 1152, below the prompt's last token (a state group has no
whole-prompt hit). Every warm run is compared with the cold run of the same prompt:
identical greedy tokens, the hit ``kvtier.coverage`` predicts, and at least what vLLM's own
prefix cache hits for the same prompt (measured first, on the same model without a
connector). The negative control changes one element of a stored state and sees the tokens
change. Disk and Redis: ``test_engine_hybrid_tiers``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_env import ENGINE_MISSING

if ENGINE_MISSING is not None:
    pytest.skip(ENGINE_MISSING, allow_module_level=True)

import tiny_models
from engine_helpers import Engine, Output, tokens, worker_connector

pytestmark = pytest.mark.vllm_engine

BLOCK = 1152
"""The block size vLLM picks for this model's groups (attention and state pages unified)."""
HYBRID = {"enable_prefix_caching": True, "mamba_cache_mode": "align",
          "kv_cache_memory_bytes": 64 << 20}
MAX_LEN = 8192
PROMPTS = {
    "one block": tokens(1, BLOCK),
    "boundary - 1": tokens(2, 2 * BLOCK - 1),
    "boundary": tokens(3, 2 * BLOCK),
    "boundary + 1": tokens(4, 2 * BLOCK + 1),
    "several blocks": tokens(5, 4 * BLOCK + 92),
}


def hybrid_engine(model: Path, connector: bool = True, kv_bytes: int | None = None,
                  **options: Any) -> Engine:
    """The model on vLLM's CPU engine (``kv_bytes`` of KV cache, default 64 MiB); with the
    connector configured by ``options`` only (no ``chunk_tokens``: the default applies)."""
    args = HYBRID if kv_bytes is None else {**HYBRID, "kv_cache_memory_bytes": kv_bytes}
    return Engine(model, num_blocks=0, max_model_len=MAX_LEN, connector=connector,
                  llm_args=args, chunk_tokens=None, **options)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.qwen3next(tmp_path_factory.mktemp("hybrid") / "qwen3next")


@pytest.fixture(scope="module")
def own_hits(model: Path) -> dict[str, int]:
    """vLLM's own prefix-cache hit for each prompt: the prompt twice, without a connector."""
    plain = hybrid_engine(model, connector=False)
    try:
        hits = {}
        for name, prompt in PROMPTS.items():
            plain.generate([prompt])
            hits[name] = plain.generate([prompt])[0].num_cached
        return hits
    finally:
        plain.close()


@pytest.fixture(scope="module")
def engine(model: Path, own_hits: dict[str, int]) -> Iterator[Engine]:
    eng = hybrid_engine(model, host_bytes=256 << 20)
    yield eng
    eng.close()


def test_default_options_start_with_one_block_per_chunk(engine: Engine) -> None:
    assert engine.layout is not None
    state, full = engine.layout.groups
    assert (state.kind, full.kind) == ("state", "full")
    assert state.tokens_per_chunk == full.tokens_per_chunk == BLOCK
    # conv (3, 1024) bf16 + delta-net state (4, 128, 128) fp32, two layers, unpadded
    assert state.bytes_per_state == 2 * (3 * 1024 * 2 + 4 * 128 * 128 * 4)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_warm_equals_cold_and_hits_at_least_vllms_own_cache(
        engine: Engine, own_hits: dict[str, int], name: str) -> None:
    prompt = PROMPTS[name]
    (cold,), (warm,) = engine.cold_then_warm([prompt])
    assert cold.num_cached == 0
    assert warm.tokens == cold.tokens
    assert warm.num_cached == engine.expected_hit(len(prompt)) >= own_hits[name]
    assert warm.num_cached % BLOCK == 0


def test_hits_are_block_multiples_below_the_last_token(engine: Engine) -> None:
    """The worked numbers: 1152 tokens hit nothing, 2303 and 2304 hit 1152, 2305 hits
    2304, 4700 hits 4608."""
    want = {"one block": 0, "boundary - 1": BLOCK, "boundary": BLOCK,
            "boundary + 1": 2 * BLOCK, "several blocks": 4 * BLOCK}
    assert {n: engine.expected_hit(len(p)) for n, p in PROMPTS.items()} == want


def test_a_concurrent_batch(engine: Engine) -> None:
    prompts = [tokens(10, 2400), tokens(11, 3500), tokens(12, 1300)]
    cold, warm = engine.cold_then_warm(prompts)
    assert [w.tokens for w in warm] == [c.tokens for c in cold]
    assert [w.num_cached for w in warm] == [engine.expected_hit(len(p)) for p in prompts]
    assert sum(w.num_cached for w in warm) == 6 * BLOCK


def test_multi_turn_chat_hits_the_previous_turns_prompt_and_answer(engine: Engine) -> None:
    """Each turn's prompt is the previous prompt, its answer and a new message; vLLM's own
    cache is reset before each turn, so every hit is kvtier's: turn 2 hits turn 1's state
    at 1152, turn 3 the state at 2304 that turn 2's prompt (holding turn 1's answer) left.

    vLLM hands over states computed by a prefill only: a boundary first crossed while
    decoding has no state to store (nor in vLLM's own cache), so a hit ends at the last
    boundary of an earlier prompt, which is what is asserted."""
    answers = [60, 8, 8]
    messages = [tokens(20, 1300), tokens(21, 1000), tokens(22, 300)]
    engine.reset()
    prompts: list[list[int]] = []
    reference: list[Output] = []
    for message, n in zip(messages, answers, strict=True):  # each turn cold
        prompt = (prompts[-1] + list(reference[-1].tokens) if prompts else []) + message
        engine.reset()
        prompts.append(prompt)
        reference.append(engine.generate([prompt], n)[0])
    engine.reset()
    hits = []
    for i, (prompt, n) in enumerate(zip(prompts, answers, strict=True)):
        engine.llm.reset_prefix_cache()
        out = engine.generate([prompt], n)[0]
        assert out.tokens == reference[i].tokens
        hits.append(out.num_cached)
        assert out.num_cached == engine.expected_hit(len(prompt), len(prompts[i - 1]) if i else 0)
    assert hits == [0, BLOCK, 2 * BLOCK]
    assert len(prompts[0]) + answers[0] < 2 * BLOCK < len(prompts[1])  # turn 3's hit spans A1


def test_a_boundary_crossed_while_decoding_stores_no_state(
        engine: Engine, model: Path) -> None:
    """The limit above, measured: 1100 prompt tokens and 100 decoded cross 1152, yet the
    next turn hits nothing from kvtier, as from vLLM's own cache."""
    first = tokens(23, 1100)
    engine.reset()
    answer = engine.generate([first], 100)[0]
    engine.llm.reset_prefix_cache()
    second = first + list(answer.tokens) + tokens(24, 200)
    assert engine.generate([second])[0].num_cached == 0


def _state_slots(engine: Engine) -> tuple[list[int], Any]:
    """Record the host slots of stored state chunks (a hook on the worker's stores)."""
    worker = worker_connector().worker
    slots: list[int] = []
    after = worker.after_forward

    def record(plan: Any) -> None:
        slots.extend(c.slot for job in plan.stores for c in job.copies if c.group == 0)
        after(plan)

    worker.after_forward = record
    return slots, worker


def test_negative_control_one_changed_state_element_changes_the_tokens(
        engine: Engine) -> None:
    """One element of the first delta-net layer's stored conv state (its newest input,
    channel 600), changed between store and load: the warm run still hits, and its tokens
    differ, so 'identical' above means the restored state is the one the cold run computed.
    (One element of the recurrent matrix moves no greedy token of this tiny model: its
    read-out is normalised per head.)"""
    prompt = PROMPTS["boundary + 1"]
    slots, worker = _state_slots(engine)
    try:
        engine.reset()
        cold = engine.generate([prompt])[0]
        worker.wait_all()
        (slot,) = slots
        conv = torch.frombuffer(worker.slab.view(slot), dtype=torch.bfloat16, count=3 * 1024)
        assert float(conv[2 * 1024 + 600]) != 50.0
        conv[2 * 1024 + 600] = 50.0
        engine.llm.reset_prefix_cache()
        warm = engine.generate([prompt])[0]
    finally:
        vars(worker).pop("after_forward", None)
    assert warm.num_cached == 2 * BLOCK
    assert warm.tokens != cold.tokens


def test_a_hit_that_extends_vllms_own_cache_hit(engine: Engine) -> None:
    """vLLM's own cache holds the state at 1152 and kvtier the one at 2304: vLLM takes its
    block, kvtier loads the state at 2304 and the attention chunk above vLLM's hit."""
    short = tokens(30, 1200)
    long = short + tokens(31, 1200)
    engine.reset()
    cold = engine.generate([long])[0]
    engine.llm.reset_prefix_cache()  # vLLM forgets; kvtier keeps the state at 2304
    assert engine.generate([short])[0].num_cached == 0  # one prefill: no state kept at 1152
    warm = engine.generate([long])[0]  # vLLM's own cache: 1152 (the short prompt's state)
    assert warm.tokens == cold.tokens
    assert warm.num_cached == 2 * BLOCK
