"""The vLLM connector's halves wait where a request would otherwise wait on vLLM's stepping
loop (issue 28; docs/vllm.md, "Where the time goes"): a load is reported by the ``collect``
of the step that started it, and a step in which vLLM scheduled nothing is marked idle."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from kvtier.integrations.vllm.scheduler import ConnectorScheduler, StepRequest  # noqa: E402
from kvtier.integrations.vllm.worker import ConnectorWorker  # noqa: E402
from kvtier.layout import Group, Layout  # noqa: E402

LAYOUT = Layout((Group("full", 4, 2, bytes_per_token=16),))  # 4-token blocks, 8-token chunks
PROMPT = list(range(20))


def _report(sched: ConnectorScheduler, worker: ConnectorWorker) -> None:
    sched.on_reports({j: (1, ok) for j, ok in worker.collect().completed.items()})


def test_a_load_is_reported_by_the_collect_of_its_step() -> None:
    gate = threading.Event()
    gate.set()
    sched = ConnectorScheduler(LAYOUT, num_slots=8, num_workers=1)
    worker = ConnectorWorker(LAYOUT, num_slots=8, fault=lambda copy: gate.wait(10))
    kv = torch.arange(16 * 2 * 4 * 2, dtype=torch.float32).reshape(16, 2, 4, 1, 2)
    worker.register([[kv]], num_blocks=16)

    sched.add_request("producer", PROMPT)
    assert sched.lookup("producer", 0) == (0, False)
    plan = sched.step([StepRequest("producer", ([1, 2, 3, 4, 5],), True, 20, PROMPT)])
    assert not plan.idle and plan.stores
    worker.before_forward(plan)
    worker.after_forward(plan)
    worker.wait_all()
    _report(sched, worker)
    sched.finish("producer")

    sched.add_request("consumer", PROMPT)
    hit, load_async = sched.lookup("consumer", 0)
    assert (hit, load_async) == (16, True)
    sched.after_alloc("consumer", ([6, 7, 8, 9, 10],), hit)
    plan = sched.step([])  # vLLM schedules nothing while the request's load runs
    assert plan.idle and plan.loads
    gate.clear()  # the load's thread stops before its first byte moves
    worker.before_forward(plan)
    gate.set()
    report = worker.collect()  # returns only once the load is done
    assert report.loaded == {"consumer"} and not report.failed_loads
    assert torch.equal(kv[6:10], kv[1:5])  # the stored blocks, in the consumer's
    worker.close()
