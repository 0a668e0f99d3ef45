"""A progress bar on stderr: tqdm when installed (the ``progress`` extra), else a line.

>>> with progress_bar(3, "replay", enabled=False) as advance:
...     advance(3)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


@contextmanager
def progress_bar(
    total: int, desc: str, *, enabled: bool = True, stream: TextIO | None = None
) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``; draws on stderr unless ``enabled`` is False."""
    if not enabled:
        yield lambda n: None
        return
    out = stream or sys.stderr
    try:
        from tqdm import tqdm
    except ImportError:
        with _line_progress(total, desc, out) as advance:
            yield advance
        return
    with tqdm(total=total, desc=desc, file=out, unit="req", leave=False,
              mininterval=0.5) as bar:
        yield bar.update


@contextmanager
def _line_progress(total: int, desc: str, out: TextIO) -> Iterator[Callable[[int], None]]:
    """The fallback: ``desc: done/total`` redrawn at most twice a second."""
    state = {"done": 0, "shown": 0.0}

    def advance(n: int) -> None:
        state["done"] += n
        now = time.monotonic()
        if now - state["shown"] >= 0.5 or state["done"] >= total:
            state["shown"] = now
            out.write(f"\r{desc}: {int(state['done'])}/{total}")
            out.flush()

    yield advance
    out.write("\r" + " " * (len(desc) + 2 * len(str(total)) + 4) + "\r")
    out.flush()
