"""Property-based hostile input: generated traces, layouts, tier configs and flags.

Whatever is generated, ``kvtier`` succeeds (strict JSON with ``--json``) or refuses in one
line with exit 2, and the config loaders return a config or raise ``ValueError``; never a
traceback, never another exception. Examples are derandomized (the same on every run) and
few, so that the folder stays well under a minute.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from hostile_cli import assert_clean, request_line, run
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvtier.layoutfile import GROUP_KEYS
from kvtier.tiers.config import DiskConfig, HostConfig, RedisConfig, TierConfig

SCALE = int(os.environ.get("KVTIER_HOSTILE_SCALE", "1"))
"""More examples, randomized, for a longer campaign (``KVTIER_HOSTILE_SCALE=20``); the
default, 1, runs the same few examples on every run."""


def hostile(examples: int) -> Any:
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=SCALE == 1,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


HUGE = [0, -1, 1, 2**31, 2**63, 2**64, 10**30, -(10**30)]
"""Integers at and past the edges of what a C int holds."""
SCALARS = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from(HUGE),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, 1e308]),
    st.booleans(), st.none(), st.text(max_size=6),
)
"""A value of any JSON type, most of them wrong where they appear."""
ANY_JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


# ---- traces ------------------------------------------------------------------------------

@st.composite
def valid_requests(draw: st.DrawFn, timestamp: float) -> str:
    inp = draw(st.integers(1, 3000))
    ids = draw(st.lists(st.integers(0, 12), min_size=-(-inp // 512), max_size=-(-inp // 512)))
    return request_line(timestamp, inp, draw(st.integers(0, 200)), ids)


@st.composite
def broken_requests(draw: st.DrawFn, timestamp: float) -> str:
    obj = json.loads(draw(valid_requests(timestamp)))
    field = draw(st.sampled_from([*obj, "extra"]))
    if draw(st.booleans()):
        obj[field] = draw(ANY_JSON)
    else:
        obj.pop(field, None)
    return json.dumps(obj) + "\n"


@st.composite
def trace_texts(draw: st.DrawFn) -> str:
    lines = []
    for i in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["valid", "valid", "broken", "text", "deep", "blank"]))
        if kind in ("valid", "broken"):
            lines.append(draw((valid_requests if kind == "valid" else broken_requests)(i * 10.0)))
        elif kind == "text":
            lines.append(draw(st.text(max_size=40)) + "\n")
        elif kind == "deep":
            depth = draw(st.sampled_from([10, 1000, 100_000]))
            lines.append("[" * depth + "]" * depth + "\n")
        else:
            lines.append("\n")
    return "".join(lines)


@hostile(40)
@given(trace_texts(), st.sampled_from([[], ["--concurrent"], ["--block-tokens", "256"],
                                        ["--policy", "all"]]))
def test_generated_traces(text: str, extra: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        argv = ["replay", str(path), "--model", "llama-3.1-8b", "--host-chunks", "16",
                "--json", *extra]
        assert_clean(run(argv), argv)


# ---- layouts -----------------------------------------------------------------------------

def mostly(valid: list[Any], invalid: list[Any]) -> st.SearchStrategy[Any]:
    """A valid value seven times in eight (shrinking towards valid)."""
    return st.one_of(*[st.sampled_from(valid)] * 7, st.sampled_from(invalid))


def rarely(draw: st.DrawFn) -> bool:
    """True one time in ten (shrinking towards False)."""
    return draw(st.integers(0, 9)) == 9


GROUP_VALUES = {
    "kind": mostly(["full", "sliding_window", "chunked_local", "state"], ["nope", "", 3]),
    "tokens_per_block": mostly([1, 16, 256], [0, -3, 2**63, 1.5, "16"]),
    "blocks_per_chunk": mostly([1, 2, 16], [0, 10**12, 2.0]),
    "window": mostly([1, 128, 4096], [0, -1, 10**18]),
    "extra_retained": mostly([0, 3], [-1, 10**18]),
    "chunk": mostly([16, 96, 8192], [0, 10**18]),
    "lookahead": mostly([0, 1, 3], [-1, 10**9]),
    "bytes_per_token": mostly([2, 131072], [0, -1, 2**64, math.nan]),
    "bytes_per_state": mostly([4096], [0, 2**64]),
    "num_layers": mostly([1, 4], [0, 10**9]),
    "draft_tail": mostly(["stored", "recomputed"], ["x"]),
    "name": mostly(["g", ""], [7]),
}


KIND_KEYS = {"sliding_window": ["window", "extra_retained"], "chunked_local": ["chunk"],
             "state": ["bytes_per_state"], "full": ["lookahead"]}
TOP_VALUES = {"hit_granularity": mostly([0, 256, 512], [7, 10**20, math.inf, "m"]),
              "model": mostly(["m"], [3]), "kv_dtype": mostly(["fp8_e4m3"], [None, 1.5]),
              "junk": SCALARS}


@st.composite
def layout_dicts(draw: st.DrawFn) -> dict[str, Any]:
    groups = []
    for _ in range(draw(st.integers(0, 3) if rarely(draw) else st.integers(1, 3))):
        kind = draw(GROUP_VALUES["kind"])
        keys = ["tokens_per_block", *KIND_KEYS.get(kind, [])]
        keys += draw(st.lists(st.sampled_from(["blocks_per_chunk", "bytes_per_token",
                                               "num_layers", "name", "draft_tail"]), max_size=2))
        if rarely(draw):
            keys.append(draw(st.sampled_from([*GROUP_KEYS, "junk"])))
        group = {"kind": kind, **{k: draw(GROUP_VALUES.get(k, SCALARS)) for k in keys}}
        groups.append(draw(SCALARS) if rarely(draw) else group)
    top: dict[str, Any] = {"groups": groups}
    for key in draw(st.lists(st.sampled_from(sorted(TOP_VALUES)), max_size=2)):
        top[key] = draw(TOP_VALUES[key])
    return top


def toml_value(value: Any) -> str:
    """A TOML rendering of plain data (``None`` has none: callers drop such keys)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()
                               if v is not None) + "}"
    return '"none"'


def toml_text(data: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items()
                   if v is not None)


@hostile(60)
@given(layout_dicts(), st.sampled_from([".json", ".toml"]),
       st.sampled_from([["explain", "--tokens", "700"], ["explain", "--hit", "256", "--json"],
                        ["replay", "--limit", "3", "--host-chunks", "8", "--json"],
                        ["replay", "--limit", "3", "--host", "1GiB", "--json"]]))
def test_generated_layouts(data: dict[str, Any], suffix: str, command: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"layout{suffix}"
        path.write_text(json.dumps(data) if suffix == ".json" else toml_text(data))
        argv = [*command, "--layout", str(path)]
        assert_clean(run(argv), argv)


# ---- tier configs ------------------------------------------------------------------------

SECTION_VALUES = st.one_of(
    SCALARS, st.sampled_from(["1GiB", "0", "1.5 MB", "9" * 400 + "GiB", "-1KiB", "lru", "arc",
                              "redis://127.0.0.1:1/0", "redis://:::/x", "redis://h:999999/0",
                              "/abc", "/tmp/kvtier-hostile-never-created"]))


@st.composite
def tier_dicts(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name, cls in (("host", HostConfig), ("disk", DiskConfig), ("redis", RedisConfig)):
        if draw(st.booleans()):
            keys = [f.name for f in dataclasses.fields(cls)] + ["junk"]
            chosen = draw(st.lists(st.sampled_from(keys), max_size=4, unique=True))
            data[name] = {k: draw(SECTION_VALUES) for k in chosen}
    for key in draw(st.lists(st.sampled_from(["write_policy", "miss_ttl_s", "junk"]),
                             max_size=2, unique=True)):
        data[key] = draw(st.one_of(SECTION_VALUES, st.sampled_from(["write-back", 0.5])))
    return draw(ANY_JSON) if rarely(draw) else data


@hostile(150)
@given(tier_dicts())
@example({"host": {"capacity": "9" * 400 + "GiB"}})  # an infinite float: OverflowError once
def test_generated_tier_configs(data: Any) -> None:
    """``TierConfig.from_dict`` and ``from_toml`` return a config or raise ValueError."""
    try:
        config = TierConfig.from_dict(data)
    except ValueError as e:
        assert str(e) and "\n" not in str(e)
    else:
        assert isinstance(config, TierConfig)
    if not isinstance(data, dict):
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiers.toml"
        path.write_text(toml_text({k: v for k, v in data.items() if not isinstance(v, dict)})
                        + "".join(f"[{name}]\n{toml_text(v)}" for name, v in data.items()
                                  if isinstance(v, dict)))
        try:
            TierConfig.from_toml(path)
        except ValueError as e:
            assert str(e)


# ---- flags -------------------------------------------------------------------------------

NUMBERS = st.sampled_from(["0", "1", "-1", "2", "7", "1e3", "nan", "inf", "", " ", "1.5",
                           "1" + "0" * 19, "1" + "0" * 30, "9" * 5000, "0x10", "１２"])
SIZES = st.sampled_from(["0", "1", "4KiB", "1KiB", "64GiB", "100TiB", "1e30", "1.5GB", "nan",
                         "-1", "10" * 30, "9" * 5000, "GiB", "1 TiB", "8EiB", ""])
SPECS = st.sampled_from(["", ",", "=", "users", "users=", "users=3", "users=1000000000",
                         "users=5,turns=2", "think_time_s=inf", "think_time_s=nan",
                         "arrival_rate_per_s=1e-300", "decode_tokens_per_s=1e-300",
                         "system_tokens=100000000", "seed=-1", "users=2,users=3",
                         "prefill_tokens_per_s=inf", "host_gb_per_s=1e-9", "prefill_slots=0",
                         "load_latency_ms=1e300", "first_token_ms=nan", "prefill_slots=10"])
REPLAY_FLAGS: dict[str, Any] = {
    "--host": SIZES, "--host-chunks": NUMBERS, "--disk": SIZES, "--disk-chunks": NUMBERS,
    "--limit": NUMBERS, "--block-tokens": NUMBERS, "--sweep": NUMBERS, "--mtp": NUMBERS,
    "--mtp-modules": NUMBERS, "--policy": st.sampled_from(["lru", ",", "all", "arc,nope", " ",
                                                           "belady,infinite", "pfreq"]),
    "--timing": SPECS, "--synthetic": SPECS, "--model": st.sampled_from(["gpt-oss-120b", "x"]),
    "--store": st.sampled_from(["blocks", "prompt", "x"]),
    "--boundaries": st.sampled_from(["dense", "end", "shared", "x"]),
    "--slot-bytes": SIZES, "--redis": st.sampled_from(["redis://127.0.0.1:1/0", ":notaport",
                                                       "redis://:::/x"]),
    "--concurrent": None, "--bytes": None, "--eagle": None, "--json": None,
}
EXPLAIN_FLAGS: dict[str, Any] = {
    "--tokens": NUMBERS, "--hit": NUMBERS, "--mtp": NUMBERS, "--mtp-modules": NUMBERS,
    "--model": st.sampled_from(["gpt-oss-120b", "llama-3.1-8b", "nope"]), "--eagle": None,
    "--json": None,
}
DEMO_FLAGS: dict[str, Any] = {
    "--turns": NUMBERS, "--user-tokens": NUMBERS, "--tokens": NUMBERS, "--seed": NUMBERS,
    "--host-bytes": SIZES, "--threads": NUMBERS, "--spec-tokens": NUMBERS,
    "--mtp-modules": NUMBERS, "--layout": st.sampled_from(["full", "mtp", "x"]),
    "--speculative": st.sampled_from(["none", "mtp", "eagle", "x"]),
    "--force-rejections": None, "--json": None,
}
SAFE_LAST = {"replay": ["--limit", "15"], "explain": [],
             "demo": ["--turns", "1", "--user-tokens", "16", "--tokens", "2", "--threads", "1"]}
"""Given last (argparse keeps the last value): every hostile value is still parsed, but a
valid run stays small."""


@st.composite
def argvs(draw: st.DrawFn, command: str, flags: dict[str, Any], tmp: str) -> list[str]:
    argv = [command]
    for flag in draw(st.lists(st.sampled_from(sorted(flags)), max_size=5)):
        argv.append(flag)
        if flags[flag] is not None:
            argv.append(draw(flags[flag]))
    if command == "replay" and draw(st.booleans()):
        argv += [draw(st.sampled_from(["--save-trace", "--out", "--disk-dir"])),
                 draw(st.sampled_from([tmp, f"{tmp}/missing/x", f"{tmp}/t.jsonl", ""]))]
    return argv + SAFE_LAST[command]


@hostile(60)
@given(st.data())
def test_generated_replay_flags(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        argv = data.draw(argvs("replay", REPLAY_FLAGS, tmp))
        assert_clean(run(argv), argv)


@hostile(40)
@given(st.data())
def test_generated_explain_flags(data: st.DataObject) -> None:
    argv = data.draw(argvs("explain", EXPLAIN_FLAGS, ""))
    assert_clean(run(argv), argv)


@hostile(12)
@given(st.data())
def test_generated_demo_flags(data: st.DataObject) -> None:
    argv = data.draw(argvs("demo", DEMO_FLAGS, ""))
    assert_clean(run(argv), argv)
