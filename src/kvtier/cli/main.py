"""Entry point and command registry for ``kvtier``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from kvtier.cli.common import Command, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _commands() -> list[Command]:
    from kvtier.cli import explain

    found = [explain.COMMAND]
    for module in ("replay", "demo"):
        try:
            mod = __import__(f"kvtier.cli.{module}", fromlist=["COMMAND"])
        except ImportError as e:
            if e.name != f"kvtier.cli.{module}":
                raise
            continue
        found.append(mod.COMMAND)
    return found


def version_line() -> str:
    """``kvtier 0.1.0 (mypyc, native C loops)``: the version and which build runs."""
    from kvtier import __version__, buildinfo

    return f"kvtier {__version__} ({buildinfo.describe()})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvtier", description="A tiered KV cache for LLM serving.")
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print kvtier's version and build (pure or mypyc, native C) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for cmd in _commands():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_run=cmd.run)
    return parser


EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as shells report it."""
EXIT_BROKEN_PIPE = 141
"""Exit status when the reader of stdout went away (128 + SIGPIPE), as ``yes | head`` has."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kvtier``; the exit status. Ctrl-C prints one line, a closed pipe nothing."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except KeyboardInterrupt:
        _say("kvtier: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except UsageError as e:
        _say(f"kvtier {args.command}: error: {e}")
    except MemoryError:
        _say(f"kvtier {args.command}: error: out of memory: a capacity, trace or option is "
             "too large for this machine; give smaller ones")
    return 2


def _say(line: str) -> None:
    """One line on stderr, unless stderr itself is gone."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError):  # not a real file (captured): no fd
        fd = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
