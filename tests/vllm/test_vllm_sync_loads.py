"""Synchronous loads (``sync_loads``, the default) inside vLLM's real Scheduler.

A hit from host memory on a model with one KV-cache group is loaded in the step that
schedules its request, before that step's forward: no step of its own. Its restored KV is
what a cold computation writes; a failed one is reported by its blocks and vLLM recomputes
the request; a model with several KV-cache groups (whose failed blocks vLLM cannot map back
to a request) keeps asynchronous loads, and so does ``sync_loads: false``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

pytest.importorskip("vllm.config", reason="needs vLLM 0.33: scripts/install_vllm_test_env.sh")
from vllm_helpers import chunks, make_sim, metrics, required

from kvtier.integrations.vllm.testing import SimGroup, VllmSim

pytestmark = pytest.mark.vllm

PROMPT = list(range(2000, 2100))  # 100 tokens
CONSUMER = PROMPT + list(range(40, 50))  # shares the 100-token prefix, 110 tokens
ONE_GROUP = [SimGroup("full", 16, num_layers=2)]
HYBRID = [SimGroup("full", 16), SimGroup("swa", 16, window=32)]


def _produce(sim: VllmSim) -> None:
    sim.add("producer", PROMPT, max_tokens=2)
    sim.run()
    sim.reset_device_cache()
    sim.add("consumer", CONSUMER, max_tokens=2)


def _first_steps(sim: VllmSim, n: int) -> list[int]:
    """Tokens the consumer was scheduled for in each of the next ``n`` steps (0: none)."""
    return [sim.step().num_scheduled_tokens.get("consumer", 0) for _ in range(n)]


def _sync_ids(sim: VllmSim) -> list[int]:
    return [job_id for meta in sim.plans for job_id in meta.plan.sync]


def _at(gate: threading.Event) -> None:
    assert gate.wait(timeout=30), "nothing opened the gate: the load was never waited for"


def _opening(gate: threading.Event, wait: Callable[..., object]) -> Callable[..., object]:
    def opening_wait(*args: object) -> object:
        gate.set()
        return wait(*args)
    return opening_wait


def test_host_hit_is_loaded_in_the_step_that_computes_its_request() -> None:
    # the load's copies wait at a gate that only the worker's waiting for a job (or running
    # it on its own thread) opens: a load not waited for before the forward is then certain
    # to be late, not merely likely
    gate = threading.Event()
    gate.set()
    sim = make_sim(ONE_GROUP, chunk_tokens=32, fault=lambda copy: _at(gate))
    engine = sim.worker.worker.engine
    engine.wait = _opening(gate, engine.wait)
    engine.run_load = _opening(gate, engine.run_load)
    _produce(sim)
    gate.clear()
    forward, at_forward = sim._forward, []

    def checked_forward(req_id: str, num_scheduled: int, out: object) -> None:
        if req_id == "consumer":  # what its forward's attention reads is there already
            at_forward.append(sim.check_restored(req_id, 96))
        forward(req_id, num_scheduled, out)

    sim._forward = checked_forward  # type: ignore[method-assign]
    assert _first_steps(sim, 1) == [len(CONSUMER) - 96]  # no step of its own
    assert at_forward == [[]]
    loads = [job for meta in sim.plans for job in meta.plan.loads]
    assert [job.request_id for job in loads] == ["consumer"]
    assert _sync_ids(sim) == [loads[0].id]
    assert metrics(sim)["hit_tokens"] == 96 and metrics(sim)["load_failures"] == 0
    assert chunks(sim, "load", "consumer") == required(sim, 96)
    assert sim.check_restored("consumer", 96) == []
    # negative control: the check sees a restored block that differs from cold KV
    block = sim.scheduler.kv_cache_manager.get_block_ids("consumer")[0][2]
    sim.kv["g0.l1"][block, 0, 3] += 1
    assert sim.check_restored("consumer", 96) == [(0, 35)]
    sim.run()
    sim.close()


@pytest.mark.parametrize(("groups", "options"), [
    (ONE_GROUP, {"sync_loads": False}), (HYBRID, {})], ids=["turned-off", "hybrid"])
def test_asynchronous_loads_take_a_step_of_their_own(groups: list[SimGroup],
                                                     options: dict[str, bool]) -> None:
    sim = make_sim(groups, chunk_tokens=32, **options)
    _produce(sim)
    assert _first_steps(sim, 2) == [0, len(CONSUMER) - 96]
    assert _sync_ids(sim) == []
    assert sim.check_restored("consumer", 96) == []
    sim.run()
    sim.close()


@pytest.mark.parametrize("store", ["all", "prompt"])
def test_failed_synchronous_load_is_recomputed(store: str) -> None:
    failing = {"on": False}

    def fault(copy: object) -> None:
        if failing["on"]:
            raise OSError("injected transfer failure")

    sim = make_sim(ONE_GROUP, chunk_tokens=32, fault=fault, store=store)
    _produce(sim)
    failing["on"] = True
    # the failed step's forward ran on the bad blocks; vLLM drops what it sampled and
    # computes the request again from its first failed block (here block 0: all of it)
    assert _first_steps(sim, 1) == [len(CONSUMER) - 96]
    failing["on"] = False
    assert len(_sync_ids(sim)) == 1
    consumer = sim.requests["consumer"].request
    assert consumer.num_computed_tokens == 0 and list(consumer.output_token_ids) == []
    assert _first_steps(sim, 1) == [len(CONSUMER)]
    assert metrics(sim)["load_failures"] == 1
    assert sim.check_restored("consumer", 96) == []  # the recomputed KV, not the bad load
    sim.run()
    assert list(consumer.output_token_ids) == [5, 5]  # max_tokens, none lost or doubled
    # the failed load's chunks were dropped and the recomputed ones stored again: the
    # next consumer hits them, loaded synchronously
    sim.reset_device_cache()
    sim.add("again", CONSUMER, max_tokens=2)
    assert sim.step().num_scheduled_tokens["again"] == len(CONSUMER) - 96
    assert sim.check_restored("again", 96) == []
    sim.run()
    sim.close()


def test_a_sync_loads_option_that_is_not_a_bool_is_refused() -> None:
    with pytest.raises(ValueError, match="sync_loads must be true or false, got 'yes'"):
        make_sim(ONE_GROUP, chunk_tokens=32, sync_loads="yes")


def test_a_request_that_ends_in_the_step_of_its_load_unpins_its_hit() -> None:
    sim = make_sim(ONE_GROUP, chunk_tokens=32)
    sim.add("producer", PROMPT, max_tokens=2)
    sim.run()
    sim.reset_device_cache()
    consumer = sim.add("consumer", CONSUMER, max_tokens=1)
    out = sim.step()  # loads, computes and finishes it
    assert out.num_scheduled_tokens == {"consumer": len(CONSUMER) - 96}
    assert consumer.is_finished() and metrics(sim)["hit_tokens"] == 96
    sim.run()
    # every stored chunk can be dropped: no load still pins one
    assert sim.scheduler.connector.scheduler.clear_cache() == 3
    sim.close()


def test_a_load_started_after_the_forward_is_computed_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """An engine that skips ``start_load_kv`` starts the loads only in ``wait_for_save``,
    after a forward that may have read blocks not yet written: the load counts as failed."""
    sim = make_sim(ONE_GROUP, chunk_tokens=32)
    _produce(sim)
    sim.worker.start_load_kv = lambda *args: None
    assert _first_steps(sim, 2) == [len(CONSUMER) - 96, len(CONSUMER)]  # then from 0
    assert metrics(sim)["load_failures"] == 1
    assert "computed again. Set sync_loads to false" in caplog.text
    assert sim.check_restored("consumer", 96) == []
    sim.run()
    sim.close()


def test_a_recurrent_state_model_loads_asynchronously() -> None:
    """A single-group recurrent model (Falcon-Mamba): vLLM would compute a failed
    synchronous load again from a block with no state before it, so its loads stay
    asynchronous, and a failure restarts the request from the start."""
    from kvtier.integrations.vllm.hybrid_parity import MODELS, TOKENS, first_hit
    from kvtier.integrations.vllm.hybrid_parity import make_sim as hybrid_sim

    sim = hybrid_sim("falcon-mamba-7b", "kvtier", worker=True)
    block = MODELS["falcon-mamba-7b"].block_size()
    first_hit(sim, "producer", TOKENS[: 2 * block + 5])
    sim.reset_device_cache()
    assert first_hit(sim, "consumer", TOKENS[: 2 * block + 15], finish=False) == 2 * block
    assert _sync_ids(sim) == [] and metrics(sim)["load_failures"] == 0
    sim.run()
    sim.close()


@pytest.mark.parametrize("how", ["fault", "late"])
def test_stores_of_kv_computed_over_a_failed_load_are_dropped(how: str) -> None:
    """The consumer computes a whole chunk past its hit in its load's step. Over a failed
    (or late) load that chunk's KV is wrong, as a real model's would be: the step's store of
    it must not publish it, and the chunk is stored again once computed over the right KV."""
    failing = {"on": False}

    def fault(copy: object) -> None:
        if failing["on"]:
            raise OSError("injected transfer failure")

    sim = make_sim(ONE_GROUP, chunk_tokens=32, fault=fault)
    forward = sim._forward

    def prefix_dependent(req_id: str, num_scheduled: int, out: object) -> None:
        failing["on"] = False  # the load failed; the step's stores would not
        req = sim.requests[req_id].request
        start = req.num_computed_tokens - num_scheduled
        wrong = start > 0 and sim.check_restored(req_id, start) != []
        forward(req_id, num_scheduled, out)
        if wrong:  # computed over KV that is not there: garbage, as a model's would be
            table = sim.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
            for p in range(start, req.num_computed_tokens):
                for layer in range(2):
                    sim.kv[f"g0.l{layer}"][table[p // 16], :, p % 16] = -3

    sim._forward = prefix_dependent  # type: ignore[method-assign]
    longer = PROMPT + list(range(40, 80))  # 140 tokens: chunk 3 (96-127) past the hit
    sim.add("producer", PROMPT, max_tokens=2)
    sim.run()
    sim.reset_device_cache()
    sim.add("consumer", longer, max_tokens=2)
    start_load_kv = sim.worker.start_load_kv
    if how == "fault":
        failing["on"] = True
    else:
        sim.worker.start_load_kv = lambda *args: None
    assert _first_steps(sim, 1) == [len(longer) - 96]
    sim.worker.start_load_kv = start_load_kv
    assert metrics(sim)["load_failures"] == 1
    assert _first_steps(sim, 1) == [len(longer)]  # computed again from the start
    assert sim.check_restored("consumer", 128) == []
    sim.run()
    sim.reset_device_cache()
    sim.add("again", longer, max_tokens=2)
    assert sim.step().num_scheduled_tokens["again"] == len(longer) - 128
    assert sim.check_restored("again", 128) == []  # chunk 3 as computed over the right KV
    sim.run()
    sim.close()


def test_a_step_finalized_after_its_transfer_results_loads_as_well() -> None:
    """With speculative decoding vLLM defers ``wait_for_save`` past the step's transfer
    results (and the drafter): the synchronous load is finished by then, and once."""
    sim = make_sim(ONE_GROUP, chunk_tokens=32)
    _produce(sim)
    connector = sim.worker
    save, clear = connector.wait_for_save, connector.clear_connector_metadata
    deferred: list[str] = []

    def deferred_save() -> None:
        deferred.append("deferred")

    def finalize() -> None:  # vLLM's finalize_kv_connector, after the results were read
        if deferred:
            deferred.clear()
            save()
        clear()

    connector.wait_for_save, connector.clear_connector_metadata = deferred_save, finalize
    sim.sync_transfers = False  # as in the engine: nothing waits for every job meanwhile
    assert _first_steps(sim, 1) == [len(CONSUMER) - 96]
    assert metrics(sim)["hit_tokens"] == 96 and metrics(sim)["load_failures"] == 0
    assert sim.check_restored("consumer", 96) == []
    sim.run()
    assert list(sim.requests["consumer"].request.output_token_ids) == [5, 5]
    sim.close()
