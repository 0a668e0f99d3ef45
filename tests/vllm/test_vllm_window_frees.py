"""A store never reads a block the sliding window freed (vLLM 0.33's real scheduler).

vLLM frees a sliding-window group's blocks as the window passes them, and may hand one to
another request in the same step, whose forward then writes it. ``boundaries: end`` serves
a prompt's last boundary; until 2026-12-05 it stored that boundary's window once the whole
prompt was computed, and when a step of chunked prefill ended past the boundary, some of
those blocks were freed by then. Here a freed block goes to a second request in the
prompt's last step: stored from it, the chunk held the other request's KV, and a later hit
restored it (this test failed so). The window is now stored in the step that passes the
boundary, while vLLM holds it, and a block the window freed is never read again
(``tests/test_vllm_quiet_steps.py`` has the retried stores that reached such blocks too)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from vllm_helpers import make_sim

from kvtier.integrations.vllm.testing import SimGroup

pytestmark = pytest.mark.vllm

GROUPS = [SimGroup("full", 16), SimGroup("swa", 16, window=32)]
PROMPT = list(range(1000, 1150))  # 150 tokens: its last boundary is 128
OTHER = list(range(5000, 5138))  # 138 tokens: the rest of the prompt's last step


def test_a_block_the_window_freed_is_not_stored_from() -> None:
    sim = make_sim(GROUPS, 32, boundaries="end", num_blocks=36)
    sim.scheduler.max_num_scheduled_tokens = 144  # the prompt's first step ends past 128
    sim.add("producer", PROMPT, max_tokens=2)
    first = sim.step()
    assert first.num_scheduled_tokens == {"producer": 144}
    swa = sim.scheduler.kv_cache_manager.get_block_ids("producer")[1]
    freed = swa[6]  # tokens 96-111: out of the window at 144 (it keeps 113 on)
    sim.add("other", OTHER, max_tokens=2)
    last = sim.step()  # the prompt's last 6 tokens, and the other request's 138
    assert last.num_scheduled_tokens == {"producer": 6, "other": 138}
    # the scenario: the freed block went to the other request, whose forward wrote it
    other_blocks = sim.scheduler.kv_cache_manager.get_block_ids("other")
    assert any(freed in ids for ids in other_blocks)
    def stored(plan: object) -> list[object]:
        return [c for job in plan.plan.stores for c in job.copies  # type: ignore[attr-defined]
                if job.request_id == "producer"]

    # 128's window (chunk 3: blocks 6 and 7) was stored in the first step, while held ...
    assert (1, 3) in {(c.group, c.chunk) for c in stored(sim.plans[0])}
    # ... and nothing in the last step reads the block the other request now holds
    assert not [c for c in stored(sim.plans[-1]) if freed in c.block_ids]
    sim.run()
    # a consumer of the same prompt restores only KV a cold computation writes
    sim.reset_device_cache()
    sim.add("consumer", PROMPT, max_tokens=2)
    out = sim.step_until_scheduled("consumer")
    hit = sim.requests["consumer"].request.num_computed_tokens - out.num_scheduled_tokens[
        "consumer"]
    assert hit == 128
    assert sim.check_restored("consumer", hit) == []
    sim.close()
