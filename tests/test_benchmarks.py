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
