"""``kvtier explain``: what a producer stores and a consumer needs, per group.

Everything printed comes from ``kvtier.coverage``; this module only formats it.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvtier import coverage
from kvtier.cli.common import (
    Command,
    UsageError,
    add_layout_arguments,
    human_bytes,
    layout_from_args,
    positive_int,
    print_json,
    table,
)
from kvtier.layout import Group, Layout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_layout_arguments(parser)
    parser.add_argument("--tokens", type=positive_int, metavar="N", default=8192,
                        help="prompt length in tokens (default 8192)")
    parser.add_argument("--hit", type=positive_int, metavar="B",
                        help="also show the chunks each group requires for a hit at boundary B")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


MAX_CHUNKS = 1_000_000
"""The most chunks of one group a report lists (it lists every boundary and stored chunk)."""


def explain(layout: Layout, num_tokens: int, hit: int | None) -> dict[str, Any]:
    """The explain report as plain data (the ``--json`` object)."""
    _check_size(layout, num_tokens)
    boundaries = coverage.admissible_boundaries(layout, num_tokens)
    if hit is not None and hit not in boundaries:
        raise UsageError(_bad_hit(layout, num_tokens, hit))
    repeat = _repeat(layout, num_tokens)
    groups = []
    for i, group in enumerate(layout.groups):
        stored = coverage.store_set(layout, i, num_tokens)
        entry: dict[str, Any] = {
            "name": group.label,
            "kind": group.kind,
            "tokens_per_chunk": group.tokens_per_chunk,
            "stored_chunks": list(stored),
            "stored_ranges": stored.compact(),
            "stored_bytes": _bytes(group, len(stored)),
            "dense_bytes": _bytes(group, coverage.dense_chunks(group, num_tokens)),
        }
        if hit is not None:
            entry["required_chunks"] = list(coverage.required(group, hit))
        entry["repeat_chunks"] = list(coverage.required(group, repeat["hit"]))
        groups.append(entry)
    return {"hit_granularity": layout.hit_granularity, "boundaries": list(boundaries),
            "repeat": repeat, "groups": groups}


def _repeat(layout: Layout, num_tokens: int) -> dict[str, Any]:
    """The hit of a consumer with this very prompt (``coverage.consumer_hits``), and whether
    it is the whole-prompt hit at boundary ``num_tokens`` (the last token computed again)."""
    hits = coverage.consumer_hits(layout, num_tokens)
    bounds = coverage.admissible_boundaries(layout, num_tokens, num_tokens)
    return {"hit": hits[-1] if hits else 0,
            "whole_prompt": bool(bounds) and bounds[-1] == num_tokens}


def _check_size(layout: Layout, num_tokens: int) -> None:
    """UsageError, before computing, if a group would have more than ``MAX_CHUNKS`` chunks."""
    finest = min(g.tokens_per_chunk for g in layout.groups)
    if num_tokens > MAX_CHUNKS * finest:
        raise UsageError(f"--tokens {num_tokens} is {-(-num_tokens // finest)} chunks of "
                         f"{finest} tokens; the report lists each, so at most {MAX_CHUNKS}: "
                         f"give --tokens <= {MAX_CHUNKS * finest}")


def _bad_hit(layout: Layout, num_tokens: int, hit: int) -> str:
    g = layout.hit_granularity
    if hit % g:
        return f"--hit {hit} is not a multiple of the hit granularity {g}"
    return (f"--hit {hit} is past the last boundary a {num_tokens}-token request can serve "
            f"(lookahead {layout.max_lookahead})")


def _bytes(group: Group, num_chunks: int) -> int | None:
    per = group.bytes_per_chunk
    return None if per is None else per * num_chunks


def render(report: dict[str, Any], num_tokens: int) -> str:
    headers = ["group", "kind", "chunk", "stored chunks", "stored", "dense", "stored/dense",
               "repeat needs"]
    hit = "required_chunks" in report["groups"][0]
    if hit:
        headers.append("required at hit")
    rows = []
    for g in report["groups"]:
        ratio = "-" if not g["dense_bytes"] else f"{g['stored_bytes'] / g['dense_bytes']:.2f}"
        row = [g["name"], g["kind"], g["tokens_per_chunk"], _clip(g["stored_ranges"]),
               human_bytes(g["stored_bytes"]), human_bytes(g["dense_bytes"]), ratio,
               _clip(coverage.ChunkRanges.from_chunks(g["repeat_chunks"]).compact(), 24)]
        if hit:
            row.append(coverage.ChunkRanges.from_chunks(g["required_chunks"]).compact())
        rows.append(row)
    b = report["boundaries"]
    shown = ", ".join(map(str, b)) if len(b) <= 8 else (
        f"{', '.join(map(str, b[:4]))}, ..., {', '.join(map(str, b[-2:]))} ({len(b)} in all)")
    head = (f"{num_tokens} tokens, hit granularity {report['hit_granularity']}, "
            f"admissible boundaries: {shown or 'none'}")
    repeat = report["repeat"]
    again = (f"its whole-prompt hit at boundary {num_tokens}: token {num_tokens - 1} is "
             "computed again" if repeat["whole_prompt"] else
             f"the last boundary below token {num_tokens - 1}, which is computed")
    head += f"\na repeat of this prompt restores {repeat['hit']} tokens ({again})"
    return head + "\n\n" + table(headers, rows)


def _clip(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def run(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    report = explain(layout, args.tokens, args.hit)
    if args.json:
        for g in report["groups"]:
            del g["stored_ranges"]
        print_json(report)
    else:
        print(render(report, args.tokens))
    return 0


COMMAND = Command("explain", "Show which chunks a producer stores and a hit needs, per group.",
                  add_arguments, run)
