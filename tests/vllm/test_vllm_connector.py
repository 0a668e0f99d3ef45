"""kvtier inside vLLM's real Scheduler: producer, device-cache reset, consumer.

Each case checks the external hit vLLM takes, that every restored position holds exactly
what a cold computation writes, and the seeds' invariant: what is loaded is what the
lookup required, and the producer stored it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from vllm_helpers import chunks, make_sim, metrics, produce_then_consume, required, scheduled

from kvtier.integrations.vllm.testing import SimGroup, SpecStandIn, VllmSim

pytestmark = pytest.mark.vllm

PROMPT = list(range(1000, 1100))  # 100 tokens
CONSUMER = PROMPT + list(range(7, 17))  # shares the 100-token prefix, 110 tokens


def _check(sim, out, hit: int) -> None:
    assert scheduled(out, "consumer") == len(CONSUMER) - hit
    assert metrics(sim)["hit_tokens"] == hit
    assert sim.check_restored("consumer", hit) == []
    loaded = chunks(sim, "load", "consumer")
    assert loaded == required(sim, hit)
    assert loaded <= chunks(sim, "store", "producer")


def test_full_attention() -> None:
    sim = make_sim([SimGroup("full", 16, num_layers=2)], chunk_tokens=32)
    _check(sim, produce_then_consume(sim, PROMPT, CONSUMER), hit=96)
    sim.run()
    sim.close()


@pytest.mark.parametrize("extra_retained", [0, 3])
@pytest.mark.parametrize("draft", [None, "eagle", "mtp"])
def test_full_plus_sliding_window(extra_retained: int, draft: str | None) -> None:
    groups = [SimGroup("full", 16), SimGroup("swa", 16, window=32, extra_retained=extra_retained)]
    spec = None
    if draft is not None:
        groups.append(SimGroup("full", 16, eagle=True))
        spec = SpecStandIn(draft, num_speculative_tokens=extra_retained + 1)
    sim = make_sim(groups, chunk_tokens=32, spec=spec, lookahead=1 if draft else 0)
    _check(sim, produce_then_consume(sim, PROMPT, CONSUMER), hit=96)
    sim.run()
    sim.close()


def test_chunked_local() -> None:
    groups = [SimGroup("full", 16), SimGroup("chunked", 16, chunk=64)]
    sim = make_sim(groups, chunk_tokens=32)
    _check(sim, produce_then_consume(sim, PROMPT, CONSUMER), hit=96)
    assert (1, 0) not in chunks(sim, "load", "consumer")  # before the attention chunk
    sim.run()
    sim.close()


@pytest.mark.parametrize("groups", [
    [SimGroup("full", 16)], [SimGroup("full", 16), SimGroup("swa", 16, window=32)]])
def test_answer_chunks_are_stored_as_decoding_passes_boundaries(groups: list[SimGroup]) -> None:
    """``store: all`` (the default): a chat's next turn hits past the first answer.

    The producer computes 139 tokens (100 prompt, 39 of its 40 answer tokens), passing
    boundaries 96 and 128 while decoding; the follow-up turn repeats the conversation and
    hits at 128."""
    sim = make_sim(groups, chunk_tokens=32)
    sim.add("producer", PROMPT, max_tokens=40)
    sim.run()
    answer = list(sim.requests["producer"].request.output_token_ids)
    sim.reset_device_cache()
    follow_up = PROMPT + answer + list(range(7, 17))
    sim.add("consumer", follow_up, max_tokens=2)
    out = sim.step_until_scheduled("consumer")
    assert scheduled(out, "consumer") == len(follow_up) - 128
    assert sim.check_restored("consumer", 128) == []
    assert chunks(sim, "load", "consumer") == required(sim, 128)
    assert chunks(sim, "load", "consumer") <= chunks(sim, "store", "producer")
    sim.run()
    sim.close()


def test_failed_load_makes_vllm_recompute() -> None:
    failing = {"on": False}

    def fault(copy: object) -> None:
        if failing["on"]:
            raise OSError("injected transfer failure")

    sim = make_sim([SimGroup("full", 16), SimGroup("swa", 16, window=32)], chunk_tokens=32,
                   fault=fault)
    sim.add("producer", PROMPT, max_tokens=2)
    sim.run()
    sim.reset_device_cache()
    failing["on"] = True
    sim.add("consumer", CONSUMER, max_tokens=2)
    out = sim.step_until_scheduled("consumer")
    failing["on"] = False
    assert scheduled(out, "consumer") == len(CONSUMER)  # recomputed from 0
    assert metrics(sim)["load_failures"] == 1 and metrics(sim)["hit_tokens"] == 0
    assert sim.check_restored("consumer", 96) == []  # the recomputed KV, not the bad load
    sim.run()
    sim.close()


def test_unknown_option_is_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        VllmSim([SimGroup("full", 16)], "KvtierConnector", {"chunk_tokns": 32}, worker=False)


def test_chunk_size_not_a_block_multiple_is_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple of its block size"):
        make_sim([SimGroup("full", 16)], chunk_tokens=24)
