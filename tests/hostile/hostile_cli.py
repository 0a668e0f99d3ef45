"""Run ``kvtier`` in process and judge its ending: the hostile-input suite's one rule.

A command ends in one of two ways: success (exit 0), or refusal (exit 2, exactly one line on
stderr, ``kvtier ...: error: ...`` or ``kvtier: interrupted``). Any other exception escapes
``run`` and fails the test with its traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.cli.main import main


@dataclass(frozen=True)
class Ending:
    code: int
    out: str
    err: str

    @property
    def refused(self) -> bool:
        """Exit 2 with exactly one line on stderr (after any progress bar, which redraws
        itself with carriage returns and clears itself), and nothing on stdout."""
        line = self.err.rsplit("\r", 1)[-1]
        return (self.code == 2 and self.out == "" and self.err.count("\n") == 1
                and line.endswith("\n") and line.startswith("kvtier"))


def run(argv: Sequence[str]) -> Ending:
    """``kvtier *argv`` in this process; stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's own errors (and --version, --help)
            code = e.code if isinstance(e.code, int) else 2
    return Ending(code, out.getvalue(), err.getvalue())


def assert_clean(ending: Ending, argv: Sequence[str]) -> None:
    """Success with strict JSON (when ``--json``), or a one-line refusal."""
    if ending.code == 0:
        if "--json" in argv:
            json.loads(ending.out, parse_constant=_no_constant)
        return
    assert ending.refused, (
        f"kvtier {' '.join(argv)!r:.300} ended {ending.code}: {ending.err!r:.2000}")


def assert_refused(ending: Ending, message: str) -> None:
    """A one-line refusal containing ``message``."""
    assert ending.refused, f"ended {ending.code}: {ending.err!r:.2000}"
    assert message in ending.err, ending.err


def _no_constant(name: str) -> None:
    raise AssertionError(f"--json printed {name}, which is not JSON")


def request_line(timestamp: object = 0, input_length: object = 600, output_length: object = 1,
                 hash_ids: object = (7, 8)) -> str:
    """One trace line (Mooncake's format) with the given fields."""
    ids = list(hash_ids) if isinstance(hash_ids, tuple) else hash_ids
    return json.dumps({"timestamp": timestamp, "input_length": input_length,
                       "output_length": output_length, "hash_ids": ids}) + "\n"
