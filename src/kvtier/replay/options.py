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
>>> parse_options(C, "a=inf", "demo")
Traceback (most recent call last):
...
ValueError: demo: a must be a finite number, got 'inf'
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import fields
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")
OptionsT = TypeVar("OptionsT", bound="Options")
Rule = Callable[[str, Any], tuple[bool, str]]
"""``rule(field name, value) -> (allowed, what the field must be)``."""


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
            raise ValueError(f"{where}: {name} must be {kind}, got {raw!r:.40}") from None
        if not math.isfinite(values[name]):
            raise ValueError(f"{where}: {name} must be a finite number, got {raw!r}")
    return cls(**values)


def check_fields(config: object, where: str, rule: Rule) -> None:
    """ValueError naming the first field of the dataclass ``config`` whose value ``rule``
    does not allow (a bool is never a number).

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class C:
    ...     n: int = 0
    >>> check_fields(C(), "demo", lambda name, v: (v >= 1, "an integer >= 1"))
    Traceback (most recent call last):
    ...
    ValueError: demo: n must be an integer >= 1, got 0
    """
    for f in fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        ok, want = rule(f.name, value)
        if isinstance(value, bool) or not ok:
            raise ValueError(f"{where}: {f.name} must be {want}, got {value!r}")


class Options(ABC):
    """A base for a frozen dataclass of options: ``parse`` builds one from
    ``key=value,...``, and every field is checked on construction by the class's
    ``allowed`` rule; errors start with ``where``."""

    where: ClassVar[str]

    @staticmethod
    @abstractmethod
    def allowed(name: str, value: Any) -> tuple[bool, str]:
        """Whether field ``name`` may hold ``value``, and what it must be (a ``Rule``)."""

    def __post_init__(self) -> None:
        check_fields(self, self.where, self.allowed)

    @classmethod
    def parse(cls: type[OptionsT], text: str) -> OptionsT:
        """Build one from ``text``; unknown keys are rejected with the known ones."""
        return parse_options(cls, text, cls.where)
