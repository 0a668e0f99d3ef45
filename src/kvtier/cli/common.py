"""Helpers shared by commands: errors, layouts from arguments, sizes and tables."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kvtier.layout import Layout


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit status 2."""


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    from kvtier.presets import PRESETS

    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model", metavar="NAME",
                     help=f"a model preset: {', '.join(PRESETS)} (default: gpt-oss-120b)")
    src.add_argument("--layout", metavar="FILE", help="a layout file (.toml or .json)")
    parser.add_argument("--mtp", type=int_in(0, MAX_SPEC_TOKENS), metavar="K", default=0,
                        help="multi-module MTP with K speculative tokens (sets E = K - 1; "
                             f"at most {MAX_SPEC_TOKENS})")
    parser.add_argument("--mtp-modules", type=int_in(0, MAX_MTP_MODULES), metavar="M",
                        default=0, help="MTP draft modules, each a draft group with lookahead "
                                        f"1..M (at most {MAX_MTP_MODULES})")
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
INT64_MAX = 2**63 - 1
"""The largest count or size any flag takes: what a C ``int64`` (numpy, torch) holds."""
MAX_SPEC_TOKENS = 64
"""The most speculative tokens ``--mtp`` and ``kvtier demo --spec-tokens`` take."""
MAX_MTP_MODULES = 16
"""The most MTP draft modules ``--mtp-modules`` takes (each is a group, or a draft layer)."""


def parse_bytes(text: str) -> int:
    """``"64GiB"`` -> 68719476736; ``"1.5GB"`` -> 1500000000; plain integers are bytes.

    A size is at least one byte and at most ``INT64_MAX`` bytes (8 EiB):

    >>> parse_bytes("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '0' is not a size from 1 byte to 8 EiB (2**63 - 1 bytes)
    """
    m = re.fullmatch(r"\s*([0-9]{1,40}(?:\.[0-9]{1,40})?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SUFFIX:
        raise argparse.ArgumentTypeError(
            f"{text!r:.60} is not a size; use a number with an optional suffix such as 512MiB "
            "or 64GiB"
        )
    value = int(Fraction(m.group(1)) * _SUFFIX[m.group(2).lower()])
    if not 1 <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size from 1 byte to 8 EiB (2**63 - 1 bytes)")
    return value


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


def int_in(low: int, high: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``, else a one-line error.

    >>> int_in(2, 64)("65")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be <= 64, got 65
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r:.60} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {value}")
        return value

    return parse


positive_int = int_in(1)
"""An argparse type: an integer from 1 to ``INT64_MAX``."""


def print_json(obj: Any) -> None:
    """Print ``obj`` as one line of strict JSON (a NaN or infinity is a bug, not output)."""
    print(json.dumps(obj, allow_nan=False))


@dataclass(frozen=True)
class Command:
    """One ``kvtier`` subcommand: its name and help, how it adds its arguments, and what runs."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
