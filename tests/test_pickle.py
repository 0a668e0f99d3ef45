"""What vLLM sends between its processes pickles, in both builds.

``vllm serve`` runs the scheduler and each worker in their own processes: a step's plan
(loads, stores, promotions, demotions) travels to the workers pickled, and store events
travel back. The compiled build's frozen classes refuse pickle's default attribute writes,
so each one pickles through its constructor; this checks every such type round-trips.
"""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError

import pytest

from kvtier.integrations.vllm.scheduler import NOTHING, StepPlan
from kvtier.integrations.vllm.tiers import Demotion, Promotion
from kvtier.keys import ChunkKey
from kvtier.planner.types import PlannedCopy, TransferJob
from kvtier.store.admission import Admission
from kvtier.store.results import EventKind, StoreEvent

KEY = ChunkKey(bytes(range(40)))


def plan() -> StepPlan:
    load = TransferJob(7, "req-1", "load",
                       (PlannedCopy(0, 1, KEY, 2, (3, 4)), PlannedCopy(1, 0, KEY, 5, (9,), 3)))
    store = TransferJob(8, "req-2", "store", (PlannedCopy(2, 3, KEY, 6, (11, 12, 13)),))
    return StepPlan(loads=(load,), stores=(store,), flush=(5, 6),
                    promotes=(Promotion(-1, "redis", (KEY,), (4,)),),
                    demotions=(Demotion(KEY, 3, 0),), idle=True, sync=(7,))


@pytest.mark.parametrize("value", [
    plan(),
    StepPlan(),
    StoreEvent(EventKind.STORED, KEY, 3, "disk"),
    StoreEvent(EventKind.EVICTED, KEY, 0),
    Admission(2, 100),  # in a replay's config, sent to its worker processes
])
def test_crosses_a_process_boundary_unchanged(value: object) -> None:
    for protocol in (pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
        back = pickle.loads(pickle.dumps(value, protocol=protocol))
        assert back == value and type(back) is type(value)


def test_a_plan_read_back_is_still_frozen() -> None:
    back = pickle.loads(pickle.dumps(plan()))
    assert back.loads[0].copies[1].first_block == 3  # negative control: fields differ
    assert back != StepPlan(loads=back.loads)
    with pytest.raises((FrozenInstanceError, AttributeError)):
        back.loads[0].copies[0].slot = 9


def test_the_quiet_plan_arrives_as_itself() -> None:
    """A worker in another process tells a quiet step by identity (``plan is NOTHING``):
    the shared plan must not arrive as an equal copy; an equal plan built elsewhere does."""
    for protocol in (pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL):
        assert pickle.loads(pickle.dumps(NOTHING, protocol=protocol)) is NOTHING
        equal = pickle.loads(pickle.dumps(StepPlan(), protocol=protocol))
        assert equal == NOTHING and equal is not NOTHING
