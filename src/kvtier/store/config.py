"""One typed configuration of the tiers: host memory, local disk, Redis, and how they chain.

Write it in Python (``TierConfig(host=HostConfig("16GiB"), ...)``) or as TOML:

.. code-block:: toml

    write_policy = "write-back"      # or "write-through"

    [host]
    capacity = "16GiB"
    policy = "lru"                   # lru | arc | s3fifo

    [disk]                           # optional
    path = "/var/cache/kvtier"
    capacity = "500GiB"

    [redis]                          # optional
    url = "redis://cache.internal:6379/0"
    timeout_s = 0.2

Sizes are integers (bytes) or strings with a unit: ``B``, ``KB``/``MB``/``GB``/``TB``
(powers of 1000) or ``KiB``/``MiB``/``GiB``/``TiB`` (powers of 1024). Unknown keys, wrong
types and bad values raise ``ValueError`` naming the field and what it accepts.

>>> cfg = TierConfig.from_dict({"host": {"capacity": "1GiB"}, "disk": {"path": "/tmp/kv",
...                             "capacity": "10GB"}})
>>> cfg.host.capacity, cfg.disk.capacity, cfg.redis is None, cfg.write_policy
(1073741824, 10000000000, True, 'write-back')
>>> TierConfig.from_dict({"host": {"capacity": 1, "size": 2}})
Traceback (most recent call last):
...
ValueError: [host]: unknown key 'size'; known keys: ['capacity', 'pin_memory', 'policy']
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

WritePolicy = Literal["write-back", "write-through"]
PolicyName = Literal["lru", "arc", "s3fifo"]
__all__ = ["DiskConfig", "HostConfig", "RedisConfig", "TierConfig", "WritePolicy", "parse_size"]

_UNITS = {
    "": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: int | str, where: str = "size") -> int:
    """Bytes in ``value``: an int, or a number with a unit.

    >>> parse_size("64GiB"), parse_size("1.5 MB"), parse_size(4096)
    (68719476736, 1500000, 4096)
    """
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    unit = _UNITS.get(m.group(2).upper()) if m else None
    if m is None or unit is None or float(m.group(1)) * unit < 1:
        raise ValueError(
            f"{where}: expected a positive size such as 4096, '512MiB' or '64GB', got "
            f"{value!r} (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    return int(float(m.group(1)) * unit)


def _check_choice(where: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{where}: must be one of {list(choices)}, got {value!r}")


def _check_number(where: str, value: object, *, low: float, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < low:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{where}: must be {kind} >= {low}, got {value!r}")


def _set_size(obj: object, name: str, where: str) -> None:
    object.__setattr__(obj, name, parse_size(getattr(obj, name), f"{where}.{name}"))


@dataclass(frozen=True)
class HostConfig:
    """Host memory: the slab loads and stores go through."""

    capacity: int | str
    """Bytes of host memory for chunks (a size: ``"16GiB"``)."""
    policy: PolicyName = "lru"
    """Eviction policy: ``lru``, ``arc`` or ``s3fifo``."""
    pin_memory: bool | None = None
    """Page-lock the slab; None pins exactly when a CUDA device is present."""

    @property
    def capacity_bytes(self) -> int:
        """``capacity`` in bytes."""
        return int(self.capacity)

    def __post_init__(self) -> None:
        _set_size(self, "capacity", "[host]")
        _check_choice("[host].policy", self.policy, get_args(PolicyName))
        if self.pin_memory not in (True, False, None):
            raise ValueError(f"[host].pin_memory: must be true, false or absent, got "
                             f"{self.pin_memory!r}")


@dataclass(frozen=True)
class DiskConfig:
    """Local disk: persistent across restarts (docs/tiers.md for the format)."""

    path: str
    """Directory of the tier (created if missing); one process per directory."""
    capacity: int | str
    """Bytes of disk for chunks, headers included (a size: ``"500GiB"``)."""
    policy: PolicyName = "lru"
    """Eviction policy: ``lru``, ``arc`` or ``s3fifo``."""
    workers: int = 2
    """I/O threads of the tier."""
    fsync: bool = True
    """fsync each chunk and the directory before it becomes visible (durability)."""

    @property
    def capacity_bytes(self) -> int:
        """``capacity`` in bytes."""
        return int(self.capacity)

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, Path)) or not str(self.path):
            raise ValueError(f"[disk].path: must be a directory path, got {self.path!r}")
        object.__setattr__(self, "path", str(self.path))
        _set_size(self, "capacity", "[disk]")
        _check_choice("[disk].policy", self.policy, get_args(PolicyName))
        _check_number("[disk].workers", self.workers, low=1, integer=True)
        if not isinstance(self.fsync, bool):
            raise ValueError(f"[disk].fsync: must be true or false, got {self.fsync!r}")


@dataclass(frozen=True)
class RedisConfig:
    """A shared Redis server; its memory limit and eviction are the server's own."""

    url: str = "redis://127.0.0.1:6379/0"
    """Server address: ``redis://host:port/db``, ``rediss://`` or ``unix://``."""
    namespace: str = "kvtier"
    """Key prefix: processes share chunks exactly when they share the namespace."""
    timeout_s: float = 0.5
    """Bound on every connect and socket operation, in seconds."""
    backoff_initial_s: float = 0.1
    """After a failed call, leave the server alone this long (doubling per failure)."""
    backoff_max_s: float = 10.0
    """The longest backoff."""
    ttl_s: int | None = None
    """Expire chunks after this many seconds; None keeps them until the server evicts."""
    workers: int = 2
    """Network threads of the tier."""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ValueError(f"[redis].url: must look like redis://host:port/db, got {self.url!r}")
        if not isinstance(self.namespace, str) or not self.namespace.strip():
            raise ValueError(f"[redis].namespace: must be a non-empty string, got "
                             f"{self.namespace!r}")
        _check_number("[redis].timeout_s", self.timeout_s, low=1e-3)
        _check_number("[redis].backoff_initial_s", self.backoff_initial_s, low=0)
        _check_number("[redis].backoff_max_s", self.backoff_max_s, low=self.backoff_initial_s)
        if self.ttl_s is not None:
            _check_number("[redis].ttl_s", self.ttl_s, low=1, integer=True)
        _check_number("[redis].workers", self.workers, low=1, integer=True)


_SECTIONS: dict[str, type] = {"host": HostConfig, "disk": DiskConfig, "redis": RedisConfig}


@dataclass(frozen=True)
class TierConfig:
    """The whole hierarchy: host memory above optional disk above optional Redis."""

    host: HostConfig
    """Host memory (required: loads and stores go through it)."""
    disk: DiskConfig | None = None
    """Local disk, or None for no disk tier."""
    redis: RedisConfig | None = None
    """A shared Redis server, or None for no Redis tier."""
    write_policy: WritePolicy = "write-back"
    """``write-back``: write a chunk down when a faster tier evicts it. ``write-through``:
    write it to every tier when it is stored."""
    miss_ttl_s: float = 1.0
    """How long a chunk found in no tier is reported absent before the tiers are asked again."""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            value = getattr(self, name)
            if not (value is None and name != "host") and not isinstance(value, cls):
                raise ValueError(f"[{name}]: expected a {cls.__name__}, got {value!r}")
        _check_choice("write_policy", self.write_policy, get_args(WritePolicy))
        _check_number("miss_ttl_s", self.miss_ttl_s, low=0)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierConfig:
        """Build from nested mappings (a parsed TOML document)."""
        top = _known_keys(data, cls, "top level")
        sections = {
            name: _section(sec_cls, top[name], name)
            for name, sec_cls in _SECTIONS.items() if name in top
        }
        if "host" not in sections:
            raise ValueError("missing [host] section: give at least [host] capacity = '...'")
        return cls(**{**top, **sections})

    @classmethod
    def from_toml(cls, path: str | Path) -> TierConfig:
        """Read a TOML file (see the module docstring)."""
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML: {e}") from None
        return cls.from_dict(data)


def _known_keys(data: Mapping[str, Any], cls: type, where: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a table of keys, got {data!r}")
    known = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    for k in data:
        if k not in known:
            raise ValueError(f"{where}: unknown key {k!r}; known keys: {known}")
    return dict(data)


def _section(cls: type, data: Any, name: str) -> Any:
    values = _known_keys(data, cls, f"[{name}]")
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [r for r in required if r not in values]
    if missing:
        raise ValueError(f"[{name}]: missing required keys {missing}")
    return cls(**values)
