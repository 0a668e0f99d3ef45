"""``key=value,...`` option strings for small frozen configs (``--timing``, ``--synthetic``).

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class C:
...     a: float = 1.0
...     n: int = 2
>>> parse_options(C, "a=2.5, n=3", "demo")
C(a=2.5, n=3)
>>> parse_options(C, "b=1", "demo")
Traceback (most recent call last):
...
ValueError: demo: 'b=1' is not key=value with a key among ['a', 'n']
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def parse_options(cls: type[T], text: str, where: str) -> T:
    """Build ``cls`` from ``text``; unknown keys and non-numbers are rejected."""
    kinds = {f.name: f.type for f in fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, raw = (s.strip() for s in part.partition("="))
        if not eq or name not in kinds:
            raise ValueError(f"{where}: {part!r} is not key=value with a key among "
                             f"{sorted(kinds)}")
        want_int = kinds[name] in (int, "int")
        try:
            values[name] = int(raw) if want_int else float(raw)
        except ValueError:
            kind = "an integer" if want_int else "a number"
            raise ValueError(f"{where}: {name} must be {kind}, got {raw!r}") from None
    return cls(**values)
