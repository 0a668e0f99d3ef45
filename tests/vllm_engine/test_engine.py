"""kvtier inside the real vLLM engine: real forward passes over real paged KV tensors.

Four tiny random-weight models (``tiny_models``): full attention (Llama), sliding plus full
layers (Gemma3: two KV-cache groups), an EAGLE draft on a Llama target and a MiMo-style MTP
model. One engine per model serves every test (module-scoped, parametrised fixture; pytest
orders the tests by model, so each engine starts once). Every warm run is compared with the
cold run of the same prompt: tokens identical, and the hit vLLM reports is the one
``kvtier.coverage`` predicts from the connector's own layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from engine_env import ENGINE_MISSING

if ENGINE_MISSING is not None:
    pytest.skip(ENGINE_MISSING, allow_module_level=True)

import tiny_models
from engine_helpers import Engine, KvProbe, tokens

pytestmark = pytest.mark.vllm_engine

NUM_BLOCKS = 14
"""KV-cache blocks (128 tokens each): room for any one request of the tests, too few for
six 250-token requests to grow past their third block together (preemption)."""

MODELS = ["llama", "gemma3", "eagle", "mtp"]


def _build(kind: str, root: Any) -> Engine:
    if kind == "llama":
        return Engine(tiny_models.llama(root / "llama"), num_blocks=NUM_BLOCKS)
    if kind == "gemma3":
        return Engine(tiny_models.gemma3(root / "gemma3"), num_blocks=NUM_BLOCKS)
    if kind == "eagle":
        target = tiny_models.llama(root / "target")
        draft = tiny_models.eagle_draft(root / "draft")
        spec = {"method": "eagle", "model": str(draft), "num_speculative_tokens": 2}
        return Engine(target, num_blocks=NUM_BLOCKS, speculative=spec)
    model = tiny_models.mimo(root / "mimo")
    spec = {"method": "mtp", "model": str(model), "num_speculative_tokens": 1}
    return Engine(model, num_blocks=NUM_BLOCKS, speculative=spec)


@pytest.fixture(scope="module", params=MODELS)
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Engine]:
    eng = _build(request.param, tmp_path_factory.mktemp(request.param))
    eng.kind = request.param  # type: ignore[attr-defined]
    yield eng
    eng.close()


@pytest.fixture
def probe(engine: Engine) -> Iterator[KvProbe]:
    p = KvProbe(engine).attach()
    yield p
    p.detach()


def test_warm_repeat_is_identical_with_the_predicted_hit(engine: Engine, probe: KvProbe) -> None:
    prompt = tokens(1, 300)
    (cold,), (warm,) = engine.cold_then_warm([prompt])
    assert cold.num_cached == 0
    assert warm.tokens == cold.tokens
    assert warm.num_cached == engine.expected_hit(len(prompt)) > 0
    # every loaded block holds exactly what the cold forward wrote into it
    assert probe.checked > 0
    assert probe.mismatches == []


def test_corrupted_restore_changes_the_output(engine: Engine, probe: KvProbe) -> None:
    """Negative control: the checks above fail when the restored bytes are wrong."""
    prompt = tokens(2, 300)
    engine.reset()
    cold = engine.generate([prompt], max_tokens=16)[0]
    assert probe.corrupt_stored() > 0
    engine.llm.reset_prefix_cache()
    warm = engine.generate([prompt], max_tokens=16)[0]
    assert warm.num_cached == engine.expected_hit(len(prompt))
    assert probe.mismatches  # the block check sees the corruption
    assert warm.tokens != cold.tokens  # and so do the tokens


def test_multi_turn_conversation(engine: Engine) -> None:
    """Each turn's prompt is the previous prompt, its answer and new text; between turns
    vLLM's own cache is reset, so the history comes back from kvtier."""
    engine.reset()
    prompt: list[int] = tokens(3, 150)
    turns = []
    stored_upto = 0
    for turn in range(3):
        out = engine.generate([prompt], max_tokens=12)[0]
        expected = engine.expected_hit(len(prompt), shared=stored_upto) if turn else 0
        assert out.num_cached == expected
        turns.append((prompt, out.tokens))
        stored_upto = len(prompt) + len(out.tokens) - 1  # the last token has no KV yet
        engine.llm.reset_prefix_cache()
        prompt = [*prompt, *out.tokens, *tokens(10 + turn, 90)]
    assert all(engine.expected_hit(len(p)) for p, _ in turns[1:])  # the test reaches hits
    assert [answer for _, answer in turns] == [_cold(engine, p, 12) for p, _ in turns]


def test_shared_prefix_diverging_mid_chunk(engine: Engine) -> None:
    engine.reset()
    first = tokens(4, 300)
    second = first[:200] + tokens(5, 100)  # diverges in the middle of chunk 1 (128..255)
    engine.generate([first])
    engine.llm.reset_prefix_cache()
    out = engine.generate([second])[0]
    assert out.num_cached == engine.expected_hit(len(second), shared=200) == 128
    assert out.tokens == _cold(engine, second, 8)


@pytest.mark.parametrize("length", [255, 256, 257])
def test_prompt_at_a_chunk_boundary(engine: Engine, length: int) -> None:
    prompt = tokens(100 + length, length)
    (cold,), (warm,) = engine.cold_then_warm([prompt])
    assert warm.tokens == cold.tokens
    assert warm.num_cached == engine.expected_hit(length)


def test_concurrent_batch(engine: Engine) -> None:
    prompts = [tokens(20 + i, 180 + 40 * i) for i in range(4)]
    cold, warm = engine.cold_then_warm(prompts)
    assert [w.tokens for w in warm] == [c.tokens for c in cold]
    assert [w.num_cached for w in warm] == [engine.expected_hit(len(p)) for p in prompts]


def test_preemption_mid_generation(engine: Engine) -> None:
    """Six requests that do not fit together: vLLM preempts some while they decode, and
    their resumed generation equals the same requests run three at a time."""
    prompts = [tokens(40 + i, 250) for i in range(6)]
    engine.reset()
    reference = engine.generate(prompts[:3], 24) + engine.generate(prompts[3:], 24)
    engine.reset()
    before = engine.counter("vllm:num_preemptions")
    together = engine.generate(prompts, 24)
    assert engine.counter("vllm:num_preemptions") > before  # the scenario happened
    assert [t.tokens for t in together] == [r.tokens for r in reference]


def test_speculative_acceptance_after_a_warm_hit(engine: Engine) -> None:
    if engine.kind not in ("eagle", "mtp"):  # type: ignore[attr-defined]
        pytest.skip("no speculative decoding in this model")
    prompt = tokens(6, 300)
    engine.reset()
    accepted = "vllm:spec_decode_num_accepted_tokens"
    drafts = "vllm:spec_decode_num_draft_tokens"
    counts = []
    for warm in (False, True):
        if warm:
            engine.llm.reset_prefix_cache()
        a0, d0 = engine.counter(accepted), engine.counter(drafts)
        out = engine.generate([prompt], max_tokens=24)[0]
        counts.append((out.tokens, engine.counter(accepted) - a0, engine.counter(drafts) - d0))
    (cold_tokens, cold_acc, cold_drafts), (warm_tokens, warm_acc, warm_drafts) = counts
    assert warm_tokens == cold_tokens
    assert cold_drafts > 0
    assert (warm_acc, warm_drafts) == (cold_acc, cold_drafts)


def _cold(engine: Engine, prompt: list[int], max_tokens: int) -> tuple[int, ...]:
    """The prompt computed from scratch by the same engine (both caches emptied)."""
    engine.reset()
    return engine.generate([prompt], max_tokens)[0].tokens
