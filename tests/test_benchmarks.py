"""Every benchmark is run by CI in its quick mode (``benchmarks/run_quick.py``, called by
``.ci/run``), so that one which no longer runs fails a build: here, that none is left out
and that the runner tells a crash from a missed target."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
pytestmark = pytest.mark.skipif(not (BENCH / "run_quick.py").is_file(),
                                reason="needs the source tree")


@pytest.fixture(scope="module")
def runner():
    spec = importlib.util.spec_from_file_location("run_quick", BENCH / "run_quick.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_quick"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["run_quick"]


def test_every_benchmark_is_listed(runner):
    on_disk = {p.stem for p in BENCH.glob("*.py")}
    assert on_disk - set(runner.BENCHMARKS) - set(runner.HELPERS) == set()
    assert set(runner.BENCHMARKS) | set(runner.HELPERS) <= on_disk  # nothing stale
    assert set(runner.BENCHMARKS.values()) <= set(runner.ENVIRONMENTS)


def test_every_benchmark_has_a_quick_mode(runner):
    for name in runner.BENCHMARKS:
        assert '"--quick"' in (BENCH / f"{name}.py").read_text(), name


def test_the_ci_script_runs_every_environment():
    ci = (BENCH.parent / ".ci" / "run").read_text()
    for env in ("main", "vllm", "vllm_cpu"):
        assert f"benchmarks/run_quick.py {env}" in ci, env


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(f"import json, sys\nassert sys.argv[1:] == ['--quick']\n{body}\n")
    return path


def test_a_missed_target_passes(runner, tmp_path):
    body = 'print("table"); print(json.dumps({"benchmark": "fine", "met": False}))'
    outcome = runner.run(_script(tmp_path, "fine", body), sys.executable)
    assert outcome.error is None and outcome.met is False
    assert outcome.cpu_seconds > 0  # a Python process ran


@pytest.mark.parametrize(("body", "says"), [
    ('raise RuntimeError("stops on its own assertion")', "exited with status 1"),
    ('print(json.dumps({"benchmark": "other", "met": True}))', "not its JSON object"),
    ('print(json.dumps({"benchmark": "bad"}))', "not its JSON object"),
    ('print("a table and no JSON")', "not its JSON object"),
    ("", "not its JSON object"),
])
def test_a_benchmark_that_does_not_run_fails(runner, tmp_path, body, says):
    outcome = runner.run(_script(tmp_path, "bad", body), sys.executable)
    assert outcome.error is not None and says in outcome.error


def test_a_benchmark_that_hangs_fails(runner, tmp_path):
    script = _script(tmp_path, "hangs", "import threading; threading.Event().wait()")
    outcome = runner.run(script, sys.executable, timeout_s=0.5)
    assert outcome.error == "still running after 0.5 s"


def _helper(name):
    """A helper module of ``benchmarks/`` (not on the import path), loaded from its file."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def figures():
    return _helper("decode_figures")


def _child(first, ratio, rounds=5):
    """A child process's rounds, each with kvtier at 1 s and the bare engine at ``ratio``."""
    return {"first": first, "stepped": [(1.0, ratio)] * rounds,
            "with": [1.0] * rounds, "without": [1.0] * rounds}


def test_decoding_figure_cancels_a_build_order_effect(figures):
    """vllm_engine's decoding figure: a true cost of 2%, and the first-built engine 1.5%
    slower whichever it is; counterbalanced children give the true cost, where children that
    mostly build kvtier's engine first do not."""
    true, order = 0.98, 1.015
    fair = [_child("kvtier", true / order), _child("bare", true * order),
            _child("kvtier", true / order), _child("bare", true * order)]
    out = figures.decode_figures(fair, 768)
    assert out["decode_kvtier_over_none"] == pytest.approx(true)
    assert out["decode_kvtier_built_first"] == pytest.approx(true / order)
    assert out["decode_kvtier_built_second"] == pytest.approx(true * order)
    biased = [_child("kvtier", true / order)] * 3 + [_child("bare", true * order)]
    assert figures.decode_figures(biased, 768)["decode_kvtier_over_none"] < true - 0.005


def test_decoding_control_meets_only_near_one(figures, capsys):
    import json

    figures.control([_child("kvtier", 0.985), _child("bare", 1.0 / 0.985)])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["met"] is True
    figures.control([_child("kvtier", 0.97), _child("bare", 0.99)])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["met"] is False


@pytest.fixture(scope="module")
def ttft():
    return _helper("ttft_figures")


def _turn(kvtier_first, ratio):
    """A turn whose warm run from kvtier takes ``ratio`` times vLLM's hit (0.01 s)."""
    return {"cold": 0.3, "kvtier": 0.01 * ratio, "vllm-hit": 0.01, "kvtier_hit": 3968,
            "vllm_hit": 3968, "kvtier_first": float(kvtier_first)}


def test_warm_ratio_cancels_which_warm_run_went_first(ttft):
    """vllm_engine's warm ratio: kvtier's warm run 1.35x vLLM's hit, and the first warm run
    after the cold one 8% slower whichever it is. Seven turns, four with kvtier's run first:
    the counterbalanced figure gives 1.35 where the median of every turn's ratio does not."""
    true, order = 1.35, 1.08
    turns = [_turn(True, true * order), _turn(False, true / order)] * 3 + [
        _turn(True, true * order)]
    out = ttft.ttft_figures(turns)
    assert out["ttft_kvtier_over_vllm_hit"] == pytest.approx(true)
    assert out["ttft_kvtier_first_over_vllm_hit"] == pytest.approx(true * order)
    assert out["ttft_vllm_first_kvtier_over_vllm_hit"] == pytest.approx(true / order)
    plain_median = sorted(t["kvtier"] / t["vllm-hit"] for t in turns)[3]
    assert plain_median == pytest.approx(true * order)  # the old figure leaned to one order
    one_order = ttft.ttft_figures([_turn(True, 1.2)])
    assert one_order["ttft_kvtier_over_vllm_hit"] == pytest.approx(1.2)
    assert one_order["ttft_vllm_first_kvtier_over_vllm_hit"] is None
