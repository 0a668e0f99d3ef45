"""Request traces in Mooncake's format: read, validate with line numbers, write.

One JSON object per line, one line per request, in arrival order (DESIGN: the trace in
``data/mooncake``)::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ...]}

``timestamp`` is the arrival time in milliseconds, ``input_length`` the prompt's tokens,
``output_length`` the generated tokens, and ``hash_ids`` one id per ``block_tokens``-token
block of the prompt (512 in Mooncake's traces; the last block may be partial). An id names
the block *and everything before it*, so two requests share a prefix exactly as far as
their id lists agree.

Sizes are bounded, so that one hostile line cannot take the replay's memory or time: a line
of at most ``MAX_LINE_CHARS`` characters, a prompt and an answer of at most
``MAX_REQUEST_TOKENS`` tokens each, at most ``MAX_HASH_IDS`` ids, a finite timestamp of at
most ``MAX_TIMESTAMP_MS``.

``read_trace`` holds every request; ``iter_trace`` reads one at a time, so that a replay
holds none it has finished (``kvtier.replay.workload``). Every problem is a ``TraceError``
naming the file and line, so that a user can fix it
(doctests run with ELLIPSIS):

>>> parse_lines(['{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [7, 8]}'])
[TraceRequest(timestamp_ms=0.0, input_length=600, output_length=1, hash_ids=(7, 8))]
>>> parse_lines(['{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [7]}'])
Traceback (most recent call last):
...
kvtier.replay.trace.TraceError: <trace> line 1: input_length 600 needs 2 hash_ids ...
"""

from __future__ import annotations

import functools
import gzip
import importlib.resources
import io
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

BLOCK_TOKENS = 512
"""Tokens per trace block in Mooncake's traces."""
BUNDLED_TRACE = "mooncake_conversation.jsonl.gz"
"""The bundled copy of Mooncake's conversation trace (package data, Apache-2.0)."""
MAX_REQUEST_TOKENS = 2**25
"""The longest prompt, and the longest answer, of one request: 33,554,432 tokens."""
MAX_HASH_IDS = 2**20
"""The most hash ids one request may have (a prompt of 2**25 tokens in 32-token blocks)."""
MAX_LINE_CHARS = 2**25
"""The longest trace line: 32 Mi characters holds ``MAX_HASH_IDS`` ids of 20 digits."""
MAX_TIMESTAMP_MS = 2**53
"""The latest arrival, in milliseconds (every integer up to it is exact as a float)."""
TraceSource = Callable[[], Iterable["TraceRequest"]]
"""Opens a trace for one pass: every call yields its requests again, in arrival order."""
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_MAX_ID = 2**64 - 1


class TraceError(ValueError):
    """A malformed trace: the message names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace."""

    timestamp_ms: float
    """Arrival time, milliseconds from the start of the trace."""
    input_length: int
    """Prompt tokens."""
    output_length: int
    """Generated tokens."""
    hash_ids: tuple[int, ...]
    """One id per trace block of the prompt; an id names the block and its whole prefix."""

    def as_json(self) -> dict[str, Any]:
        ts: float | int = int(self.timestamp_ms) if self.timestamp_ms.is_integer() else (
            self.timestamp_ms)
        return {"timestamp": ts, "input_length": self.input_length,
                "output_length": self.output_length, "hash_ids": list(self.hash_ids)}


def bundled_trace_path() -> Any:
    """The bundled conversation trace, as an importlib.resources traversable."""
    return importlib.resources.files("kvtier").joinpath("data").joinpath(BUNDLED_TRACE)


@contextmanager
def _open_text(source: str | Path | Any) -> Iterator[IO[str]]:
    """Open a trace file, plain or gzip-compressed (by its magic bytes), as text."""
    try:
        raw = source.open("rb") if hasattr(source, "open") and not isinstance(
            source, (str, Path)) else open(source, "rb")  # noqa: SIM115
    except OSError as e:
        raise TraceError(f"cannot read trace {source}: {e.strerror or e}") from None
    with raw:
        magic = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
        stream = cast("IO[bytes]", gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw)
        yield io.TextIOWrapper(stream, encoding="utf-8", errors="strict")


def read_trace(
    source: str | Path | Any | None = None, *, block_tokens: int = BLOCK_TOKENS,
    limit: int | None = None,
) -> list[TraceRequest]:
    """Every request of a trace file (the bundled trace when ``source`` is None), held in a
    list; ``iter_trace`` reads them one at a time. ``limit`` keeps only the first that many.
    """
    return list(iter_trace(source, block_tokens=block_tokens, limit=limit))


def iter_trace(
    source: str | Path | Any | None = None, *, block_tokens: int = BLOCK_TOKENS,
    limit: int | None = None,
) -> Iterator[TraceRequest]:
    """The requests of a trace file, read and checked one line at a time (the file stays
    open while the iterator runs); ``TraceError`` when a line is reached that is bad."""
    path = bundled_trace_path() if source is None else source
    name = BUNDLED_TRACE if source is None else str(source)
    with _open_text(path) as f:
        try:
            yield from iter_lines(_bounded_lines(f), block_tokens=block_tokens, limit=limit,
                                  name=name)
        except (UnicodeDecodeError, EOFError, OSError, gzip.BadGzipFile) as e:
            raise TraceError(f"{name}: not a readable text trace ({e})") from None


def trace_source(
    source: str | Path | None, *, block_tokens: int = BLOCK_TOKENS, limit: int | None = None,
) -> TraceSource:
    """A trace file to stream (the bundled trace when None): each call opens it again
    (``iter_trace``). A trace that cannot be read twice (a pipe, a device) is read once
    and held."""
    if source is not None and not Path(source).is_file():
        return functools.partial(iter, read_trace(source, block_tokens=block_tokens,
                                                  limit=limit))
    return functools.partial(iter_trace, source, block_tokens=block_tokens, limit=limit)


def _bounded_lines(f: IO[str]) -> Iterator[str]:
    """The lines of ``f``, none read past ``MAX_LINE_CHARS + 1`` characters (``/dev/zero``
    is one endless line: ``iter_lines`` refuses it at that length)."""
    while line := f.readline(MAX_LINE_CHARS + 1):
        yield line


def parse_lines(
    lines: Iterable[str], *, block_tokens: int = BLOCK_TOKENS, limit: int | None = None,
    name: str = "<trace>",
) -> list[TraceRequest]:
    """Parse trace lines (blank lines are skipped); ``TraceError`` names the bad line."""
    return list(iter_lines(lines, block_tokens=block_tokens, limit=limit, name=name))


def iter_lines(
    lines: Iterable[str], *, block_tokens: int = BLOCK_TOKENS, limit: int | None = None,
    name: str = "<trace>",
) -> Iterator[TraceRequest]:
    """``parse_lines``, one request at a time: holds one line and its request."""
    count = 0
    last_ts = float("-inf")
    for number, line in enumerate(lines, start=1):
        if limit is not None and count >= limit:
            break
        if len(line) > MAX_LINE_CHARS:
            raise TraceError(f"{name} line {number}: longer than {MAX_LINE_CHARS} characters; "
                             "a request is one JSON object per line")
        if not line.strip():
            continue
        req = _parse_line(line, block_tokens, f"{name} line {number}")
        if req.timestamp_ms < last_ts:
            raise TraceError(f"{name} line {number}: timestamp {req.timestamp_ms:g} is before "
                             f"the previous line's {last_ts:g}; sort the trace by arrival")
        last_ts = req.timestamp_ms
        count += 1
        yield req
    if not count:
        raise TraceError(f"{name}: the trace has no requests")


def _parse_line(line: str, block_tokens: int, where: str) -> TraceRequest:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise TraceError(f"{where}: not a usable JSON value ({e})") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply; a request is one flat "
                         "object") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object with fields {list(_FIELDS)}")
    missing = [f for f in _FIELDS if f not in obj]
    if missing:
        raise TraceError(f"{where}: missing field(s) {missing}; a request needs {list(_FIELDS)}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts <= (
            MAX_TIMESTAMP_MS):
        raise TraceError(f"{where}: timestamp must be a number of milliseconds from 0 to "
                         f"2**53, got {ts!r:.40}")
    inp = _count(obj["input_length"], "input_length", 1, where)
    outp = _count(obj["output_length"], "output_length", 0, where)
    ids = _hash_ids(obj["hash_ids"], where)
    need = -(-inp // block_tokens)
    if len(ids) != need:
        raise TraceError(f"{where}: input_length {inp} needs {need} hash_ids of "
                         f"{block_tokens}-token blocks, got {len(ids)}")
    return TraceRequest(float(ts), inp, outp, ids)


def _count(value: object, field: str, low: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not (
            low <= value <= MAX_REQUEST_TOKENS):
        raise TraceError(f"{where}: {field} must be an integer >= {low} and <= "
                         f"{MAX_REQUEST_TOKENS}, got {value!r:.40}")
    return value


def _hash_ids(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(f"{where}: hash_ids must be a list of integers, got {value!r:.40}")
    if len(value) > MAX_HASH_IDS:
        raise TraceError(f"{where}: {len(value)} hash_ids; a request has at most "
                         f"{MAX_HASH_IDS}")
    if not value or (set(map(type, value)) == {int} and min(value) >= 0
                     and max(value) <= _MAX_ID):  # all plain ints in range, at C speed
        return tuple(value)
    for i, h in enumerate(value):  # find the first bad one, for the message
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= _MAX_ID:
            raise TraceError(f"{where}: hash_ids[{i}] must be an integer in [0, 2**64), "
                             f"got {h!r:.40}")
    return tuple(value)


def write_trace(requests: Iterable[TraceRequest], path: str | Path) -> None:
    """Write requests in Mooncake's format (gzip-compressed when the name ends in .gz)."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "wt", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r.as_json()) + "\n")
