"""The decoding figures of ``vllm_engine.py``, from its child processes' rounds (a helper,
not a benchmark): each child's median ratio of bare to kvtier decoding seconds, their
geometric mean (as many children built kvtier's engine first as second, which cancels a
build-order effect), and the ``--control`` report.

Why child processes: with two engines that are the same (no connector on either,
``--control``), the one a process built first decoded 1.1-1.5% slower than the other in
every process measured (ratios 0.983-0.986 with it on the kvtier side, 1.011-1.013 on the
bare side). Half the children build kvtier's engine first and half second, and the
geometric mean of their medians cancels an effect that slows the first engine by a fixed
factor. Between processes the figure also moves by up to 2% (each process's own rounds stay
within about 1%), hence more than one process per order. ``decode_runs_kvtier_over_none``
keeps an earlier measure for comparison (whole generations timed, prefill subtracted,
alternating run by run, median of the rounds' ratios, every process's together)."""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from kvtier.buildinfo import describe


def decode_figures(children: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    """The decoding figures of the child processes: the geometric mean of their median
    round ratios (bare / kvtier seconds), as many built kvtier's engine first as second,
    which cancels a build-order effect; and the median of each order's rounds."""
    med = statistics.median
    per_process = [med(b / k for k, b in h["stepped"]) for h in children]
    by_first: dict[str, list[float]] = {"kvtier": [], "bare": []}
    for h in children:
        by_first[h["first"]] += [b / k for k, b in h["stepped"]]
    stepped = [pair for h in children for pair in h["stepped"]]
    runs = [a / b for h in children for a, b in zip(h["with"], h["without"], strict=True)]
    return {
        "decode_kvtier_over_none": math.exp(statistics.fmean(map(math.log, per_process))),
        "decode_kvtier_built_first": med(by_first["kvtier"]),
        "decode_kvtier_built_second": med(by_first["bare"]),
        "decode_process_medians": [(h["first"], round(m, 4))
                                   for h, m in zip(children, per_process, strict=True)],
        "decode_tok_s_kvtier": med(tokens / k for k, _ in stepped),
        "decode_tok_s_none": med(tokens / b for _, b in stepped),
        "decode_ratios": {f: [round(x, 3) for x in xs] for f, xs in by_first.items()},
        "decode_runs_kvtier_over_none": med(runs),
        "decode_runs_ratios": [round(x, 3) for x in runs],
    }


def control(children: list[dict[str, Any]], kind: str = "bare") -> None:
    """``--control``: both engines bare, the counterbalanced figure should be 1; ``--control
    null``: a connector that does nothing in kvtier's place, what vLLM's connector plumbing
    costs any connector (a floor for kvtier's figure; no target)."""
    figures = decode_figures(children, 1)
    ratio = figures["decode_kvtier_over_none"]
    null = kind == "null"
    targets = {} if null else {"decode_control_min": 0.99, "decode_control_max": 1.01}
    print("control: a connector that does nothing in kvtier's place (vLLM's plumbing alone)"
          if null else "control: no connector on either engine (the benchmark's fairness check)")
    print(f"  engine in kvtier's place built first:  {figures['decode_kvtier_built_first']:.4f}")
    print(f"  engine in kvtier's place built second: {figures['decode_kvtier_built_second']:.4f}")
    print(f"  per process: {figures['decode_process_medians']}")
    print(f"  geometric mean{' (no target)' if null else ' (should be 1)'}:"
          f"{'' if null else ' ' * 5}           {ratio:.4f}")
    name = "decode_null_connector" if null else "decode_control"
    print(json.dumps({"benchmark": "vllm_engine", "build": describe(),
                      "figures": {name: ratio,
                                  f"{name}_built_first": figures["decode_kvtier_built_first"],
                                  f"{name}_built_second": figures["decode_kvtier_built_second"],
                                  "decode_process_medians": figures["decode_process_medians"]},
                      "targets": targets,
                      "met": null or targets["decode_control_min"] <= ratio
                      <= targets["decode_control_max"]}))
