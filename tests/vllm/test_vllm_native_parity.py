"""Never fewer hits than vLLM's native offloading (issue 22), on vLLM's real Scheduler.

The three kinds of request where native once restored more: an exact repeat of a prompt
that ends on a chunk boundary, a consumer sharing only the start of a producer's prompt
with chunked-local groups under ``end`` and ``shared``, and a preempted request resuming.
Each runs the same tokens through native offloading (workers stood in for) and through
kvtier (the stand-in runner, restored KV checked against cold). Compared: the tokens vLLM
does not compute for the consumer. Native reports a repeated prompt's whole length and
vLLM computes its last token again; kvtier restores all but that token.

Geometry: 16-token blocks, 64-token chunks.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from vllm_helpers import (
    allocated_below,
    chunks,
    make_sim,
    native_sim,
    required,
    restored,
    retained_blocks,
)

from kvtier.integrations.vllm.testing import SimGroup, VllmSim

pytestmark = pytest.mark.vllm

CHUNK = 64
GEOMETRIES = {
    "full": [SimGroup("full", 16)],
    "full+swa128": [SimGroup("full", 16), SimGroup("swa", 16, window=128)],
    # W + E = 129, one past a chunk: the whole-prompt hit keeps one more chunk's token
    "full+swa128-E1": [SimGroup("full", 16), SimGroup("swa", 16, window=128, extra_retained=1)],
    "full+local256": [SimGroup("full", 16), SimGroup("chunked", 16, chunk=256)],
}
_rng = random.Random(22)
TOKENS = [_rng.randrange(1, 30000) for _ in range(600)]


def _check_restore(sim: VllmSim, hit: int) -> None:
    """The seeds' invariant at the hit: vLLM holds exactly the retained blocks, each one
    loaded from what the producer stored, holding what a cold computation writes."""
    assert allocated_below(sim, "consumer", hit) == retained_blocks(sim, hit)
    loaded = chunks(sim, "load", "consumer")
    assert loaded == required(sim, hit)
    assert loaded <= chunks(sim, "store", "producer")
    assert sim.check_restored("consumer", hit) == []


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("mode", ["dense", "end", "shared"])
def test_an_exact_repeat_restores_all_but_the_last_token(geometry: str, mode: str) -> None:
    """A 256-token prompt repeated: native 256 with token 255 computed again (192 with a
    sliding window), kvtier restores tokens [0, 255) and vLLM computes token 255 only."""
    groups, prompt = GEOMETRIES[geometry], TOKENS[:256]
    native = restored(native_sim(groups, CHUNK), prompt, prompt)
    sim = make_sim(groups, CHUNK, boundaries=mode)
    assert restored(sim, prompt, prompt) == 255 >= native
    _check_restore(sim, 255)
    sim.run()
    sim.close()


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize(("length", "hit"), [(255, 192), (257, 256), (320, 319)])
def test_one_token_either_side_of_a_boundary(geometry: str, length: int, hit: int) -> None:
    groups, prompt = GEOMETRIES[geometry], TOKENS[:length]
    native = restored(native_sim(groups, CHUNK), prompt, prompt)
    sim = make_sim(groups, CHUNK)
    assert restored(sim, prompt, prompt) == hit >= native
    _check_restore(sim, hit)
    sim.close()


@pytest.mark.parametrize("mode", ["dense", "end", "shared"])
@pytest.mark.parametrize(("shared", "hit"), [(478, 448), (250, 192)])
def test_chunked_local_consumer_of_the_start_of_a_prompt(mode: str, shared: int, hit: int):
    """Full + chunked local (C = 256), a 547-token producer, a consumer of its first 478
    tokens: native 448, kvtier 448 in every mode (chunked-local chunks are not pruned);
    of its first 250: 192 (the local span [0, 192), chunks 0-2)."""
    groups = GEOMETRIES["full+local256"]
    native = restored(native_sim(groups, CHUNK), TOKENS[:547], TOKENS[:shared])
    sim = make_sim(groups, CHUNK, boundaries=mode)
    assert restored(sim, TOKENS[:547], TOKENS[:shared]) == hit >= native
    _check_restore(sim, hit)
    sim.close()


def test_pruning_chunked_local_is_the_users_choice() -> None:
    """``prune_chunked_local``: ``end`` stores the local spans of the prompt's end only
    (boundary 512 and its whole-prompt hit 511: chunks 4-7), so a consumer of the first
    250 tokens, which needs chunks 0-2 at 192, misses."""
    sim = make_sim(GEOMETRIES["full+local256"], CHUNK, boundaries="end",
                   prune_chunked_local=True)
    assert restored(sim, TOKENS[:547], TOKENS[:250]) == 0
    assert {c for g, c in chunks(sim, "store", "producer") if g == 1} == {4, 5, 6, 7}
    sim.close()


def _preempted_then_resumed(sim: VllmSim) -> tuple[int, int]:
    """Request ``big`` (400 tokens) first, then ``consumer`` (300 tokens); both decode
    until blocks run out and vLLM preempts ``consumer``, the later one. Returns the tokens
    ``consumer`` knew when preempted and where its compute resumed."""
    sim.add("big", TOKENS[:400], max_tokens=200, output=list(range(100, 300)))
    sim.add("consumer", TOKENS[400:600] + TOKENS[:100], max_tokens=120,
            output=list(range(500, 620)))
    request = sim.requests["consumer"].request
    known = 0
    for _ in range(600):
        out = sim.step()
        if "consumer" in out.preempted_req_ids:
            known = request.num_tokens
        elif known and "consumer" in out.num_scheduled_tokens:
            return known, request.num_computed_tokens - out.num_scheduled_tokens["consumer"]
    raise AssertionError("consumer was never preempted and resumed")


@pytest.mark.parametrize(("store", "resume"), [("all", 320), ("prompt", 256)])
def test_a_preempted_request_resumes_from_its_generated_tokens(store: str, resume: int) -> None:
    """Full attention, 54 blocks: ``consumer`` is preempted with 369 tokens known (300
    prompt, 69 generated). Native resumes from 240; kvtier from 320, the last boundary its
    first run stored (``store: all``), or 256 when only prompts are stored."""
    groups = GEOMETRIES["full"]
    native = native_sim(groups, CHUNK, num_blocks=54)
    sim = make_sim(groups, CHUNK, num_blocks=54, store=store)
    known, native_resume = _preempted_then_resumed(native)
    assert _preempted_then_resumed(sim) == (known, resume)
    assert resume >= native_resume or store == "prompt"
    assert sim.check_restored("consumer", resume) == []
    sim.run()
    sim.close()
