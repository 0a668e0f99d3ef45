"""Helpers shared by commands: errors, layouts from arguments, sizes and tables."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from kvtier.layout import Layout


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    from kvtier.presets import PRESETS

    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="NAME",
                     help=f"a model preset: {', '.join(PRESETS)} (default: gpt-oss-120b)")
    src.add_argument("--layout", metavar="FILE", help="a layout file (.toml or .json)")
    parser.add_argument("--mtp", type=int, metavar="K", default=0,
                        help="multi-module MTP with K speculative tokens (sets E = K - 1)")
    parser.add_argument("--mtp-modules", type=int, metavar="M", default=0,
                        help="MTP draft modules, each a draft group with lookahead 1..M")
    parser.add_argument("--eagle", action="store_true", help="add an EAGLE draft group")


def layout_from_args(args: argparse.Namespace) -> Layout:
    from kvtier.layoutfile import load_layout
    from kvtier.presets import preset, with_eagle, with_mtp

    try:
        layout = load_layout(args.layout) if args.layout else preset(args.model or "gpt-oss-120b")
        if args.mtp or args.mtp_modules:
            layout = with_mtp(layout, args.mtp or 1, args.mtp_modules)
        if args.eagle:
            layout = with_eagle(layout)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return layout


_SUFFIX = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
           "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
           "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"64GiB"`` -> 68719476736; ``"1.5GB"`` -> 1500000000; plain integers are bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SUFFIX:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; use a number with an optional suffix such as 512MiB or 64GiB"
        )
    return int(float(m.group(1)) * _SUFFIX[m.group(2).lower()])


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
