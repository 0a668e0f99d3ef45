"""Admission through vLLM (``admit_after`` in ``kv_connector_extra_config``): the
connector's scheduler stores a chunk only at its second offer, and a later hit restores
exactly what a cold computation writes."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from vllm_helpers import make_sim, metrics, scheduled

from kvtier.integrations.vllm.testing import SimGroup

pytestmark = pytest.mark.vllm

PROMPT = list(range(1000, 1100))  # 100 tokens: 3 whole chunks of 32


def _consume(sim, rid: str) -> int:
    """Run ``rid`` (the same prompt) after a device-cache reset; the tokens restored."""
    sim.reset_device_cache()
    sim.add(rid, PROMPT, max_tokens=2)
    out = sim.step_until_scheduled(rid)
    hit = len(PROMPT) - scheduled(out, rid)
    if hit:
        assert sim.check_restored(rid, hit) == []
    sim.run()
    return hit


def test_admit_after_2_stores_at_the_second_sighting() -> None:
    sim = make_sim([SimGroup("full", 16, num_layers=2)], chunk_tokens=32, admit_after=2)
    assert [_consume(sim, f"r{i}") for i in range(3)] == [0, 0, 96]
    m = metrics(sim)
    assert m["chunks_not_admitted"] == 3 and m["chunks_stored"] == 3
    sim.close()


def test_admit_after_1_stores_at_the_first() -> None:
    sim = make_sim([SimGroup("full", 16, num_layers=2)], chunk_tokens=32, admit_after=1)
    assert [_consume(sim, f"r{i}") for i in range(2)] == [0, 96]
    assert metrics(sim)["chunks_not_admitted"] == 0
    sim.close()
