"""A quiet step's horizons (``continuing_horizons``, read from vLLM's ``SchedulerOutput``
alone) are the horizons a planned step reads from vLLM's requests (``scheduled_steps``):
checked at every step vLLM 0.33's real scheduler takes, with and without a draft group.
(This stand-in runner proposes no draft tokens; ``tests/test_vllm_quiet_steps.py`` reads a
step that schedules some.)"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from vllm_helpers import make_sim

from kvtier.integrations.vllm.scheduled import continuing_horizons, scheduled_steps
from kvtier.integrations.vllm.testing import SimGroup, SpecStandIn

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("draft", [None, "mtp"])
def test_quiet_horizons_are_the_planned_ones(draft: str | None) -> None:
    groups = [SimGroup("full", 16), SimGroup("swa", 16, window=32)]
    spec = None
    if draft is not None:
        groups.append(SimGroup("full", 16, eagle=True))
        spec = SpecStandIn(draft, num_speculative_tokens=2)
    sim = make_sim(groups, chunk_tokens=32, spec=spec, lookahead=1 if draft else 0)
    connector = sim.scheduler.connector
    build = connector.build_connector_meta
    compared: list[tuple[Any, Any]] = []

    def checked(out: Any) -> Any:  # at the call, before vLLM advances its requests
        quiet = continuing_horizons(out)
        if quiet is not None:
            steps = scheduled_steps(out, connector._requests, connector.layout)
            compared.append((quiet, [(s.request_id, s.horizon) for s in steps]))
        return build(out)

    connector.build_connector_meta = checked
    for i in range(3):
        sim.add(f"r{i}", list(range(100 * i, 100 * i + 40 + 7 * i)), max_tokens=30,
                output=list(range(7, 37)))
    sim.run()
    sim.close()
    assert len(compared) > 20  # decoding steps were compared
    for quiet, planned in compared:
        assert quiet == planned
