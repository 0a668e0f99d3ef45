"""Traces: the bundled copy, malformed lines (with their line numbers), round trips."""

from __future__ import annotations

import doctest
import gzip
import json
from pathlib import Path

import pytest
from oracles import simple_infinite

from kvtier.replay import metadata, options, synth, timing, trace
from kvtier.replay.trace import TraceError, TraceRequest, parse_lines, read_trace, write_trace

GOOD = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}


def line(**changes: object) -> str:
    return json.dumps({**GOOD, **changes})


def test_bundled_trace_facts() -> None:
    """The figures of data/mooncake/README.md, recomputed."""
    reqs = read_trace()
    assert len(reqs) == 12031
    assert sum(len(r.hash_ids) for r in reqs) == 288_500
    assert len({h for r in reqs for h in r.hash_ids}) == 182_790
    assert round((reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000) == 3537
    hits, refs = simple_infinite(reqs)
    assert round(hits / refs, 4) == 0.3664


def test_bundled_trace_is_package_data_with_its_license() -> None:
    path = trace.bundled_trace_path()
    assert path.is_file()
    note = path.parent.joinpath("MOONCAKE_LICENSE.md").read_text()
    assert "Apache-2.0" in note and "kvcache-ai/Mooncake" in note


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"timestamp": 0, "input_length": 5}), "missing field(s) ['output_length'"),
    (line(timestamp=-1), "timestamp must be a number"),
    (line(timestamp="soon"), "timestamp must be a number"),
    (line(input_length=0, hash_ids=[]), "input_length must be an integer >= 1"),
    (line(input_length=1.5), "input_length must be an integer"),
    (line(output_length=-2), "output_length must be an integer >= 0"),
    (line(hash_ids="1,2"), "hash_ids must be a list"),
    (line(hash_ids=[1, -2]), "hash_ids[1] must be an integer"),
    (line(hash_ids=[1, True]), "hash_ids[1] must be an integer"),
    (line(hash_ids=[1]), "input_length 600 needs 2 hash_ids of 512-token blocks, got 1"),
    (line(hash_ids=[1, 2, 3]), "needs 2 hash_ids"),
])
def test_malformed_line_names_its_line(text: str, message: str) -> None:
    with pytest.raises(TraceError) as e:
        parse_lines([line(), "", text], name="t.jsonl")
    assert str(e.value).startswith("t.jsonl line 3: ")
    assert message in str(e.value)


def test_out_of_order_and_empty_traces() -> None:
    with pytest.raises(TraceError, match=r"line 2: timestamp 1 is before .* sort the trace"):
        parse_lines([line(timestamp=5), line(timestamp=1)])
    with pytest.raises(TraceError, match="the trace has no requests"):
        parse_lines(["", "  "])


def test_files_plain_gzip_missing_and_binary(tmp_path: Path) -> None:
    reqs = [TraceRequest(0.0, 600, 3, (1, 2)), TraceRequest(1.5, 10, 0, (3,))]
    for name in ("t.jsonl", "t.jsonl.gz"):
        write_trace(reqs, tmp_path / name)
        assert read_trace(tmp_path / name) == reqs
        assert read_trace(tmp_path / name, limit=1) == reqs[:1]
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "absent.jsonl")
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not a readable text trace"):
        read_trace(tmp_path / "bin")
    (tmp_path / "trunc.gz").write_bytes(gzip.compress(b"x" * 1000)[:20])
    with pytest.raises(TraceError):
        read_trace(tmp_path / "trunc.gz")


def test_other_block_sizes() -> None:
    assert parse_lines([line(hash_ids=[1, 2, 3, 4, 5])], block_tokens=128)[0].hash_ids == (
        1, 2, 3, 4, 5)


@pytest.mark.parametrize("module", [trace, options, synth, metadata, timing])
def test_doctests(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.failed == 0 and result.attempted > 0
