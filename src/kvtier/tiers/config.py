"""One typed configuration of the tiers: host memory, local disk, Redis, and how they chain.

Write it in Python (``TierConfig(host=HostConfig("16GiB"), ...)``) or as TOML:

.. code-block:: toml

    write_policy = "write-back"      # or "write-through"
    admit_after = 1                  # store a chunk at its N-th offer (1: every offer)

    [host]
    capacity = "16GiB"
    policy = "lru"                   # lru | arc | s3fifo

    [disk]                           # optional
    path = "/var/cache/kvtier"
    capacity = "500GiB"

    [redis]                          # optional
    url = "redis://cache.internal:6379/0"   # or, for a Redis Cluster:
    # cluster_nodes = ["10.0.0.1:6379", "10.0.0.2:6379"]
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
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from kvtier.store.admission import Admission
from kvtier.tiers.redis.options import (
    DEFAULT_URL,
    MAX_TIMEOUT_S,
    MAX_TTL_S,
    check_cluster_namespace,
    check_cluster_nodes,
    check_url,
    read_password,
    redact,
)

if TYPE_CHECKING:
    from kvtier.tiers.records.seal import Seal

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
    size = float(m.group(1)) * unit if m and unit else 0.0
    if not 1 <= size < math.inf:  # '9' * 400 + 'GiB' is an infinite float
        raise ValueError(
            f"{where}: expected a positive size such as 4096, '512MiB' or '64GB', got "
            f"{value!r:.60} (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    return int(size)


def _check_choice(where: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{where}: must be one of {list(choices)}, got {value!r}")


def check_number(
    where: str, value: object, *, low: float, high: float = math.inf, integer: bool = False
) -> None:
    """``ValueError`` unless ``value`` is a finite number (an int if ``integer``) in
    ``[low, high]``: NaN and infinity are refused wherever a number is read.

    >>> check_number("timeout_s", float("inf"), low=0)
    Traceback (most recent call last):
    ...
    ValueError: timeout_s: must be a finite number >= 0, got inf
    """
    kinds = (int,) if integer else (int, float)
    if (isinstance(value, bool) or not isinstance(value, kinds)
            or not _finite(value) or not low <= value <= high):
        kind = "an integer" if integer else "a finite number"
        bound = f"in {low}..{high}" if math.isfinite(high) else f">= {low}"
        raise ValueError(f"{where}: must be {kind} {bound}, got {value!r}")


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past every float: 10**400 seconds is no timeout either
        return False


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
    secret_file: str | None = None
    """A file holding the secret that authenticates records (HMAC-SHA256): without it
    nobody can forge a chunk here. Every process sharing the records needs the same one."""
    secret_env: str | None = None
    """An environment variable holding that secret (instead of ``secret_file``)."""
    encrypt: bool = False
    """Encrypt records with AES-GCM under the secret (needs it, and ``kvtier[crypto]``)."""

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
        check_number("[disk].workers", self.workers, low=1, integer=True)
        if not isinstance(self.fsync, bool):
            raise ValueError(f"[disk].fsync: must be true or false, got {self.fsync!r}")
        _check_secret(self, "[disk]")

    def seal(self) -> Seal | None:
        """How records are protected (the secret read now): ``kvtier.tiers.records.seal``."""
        return _seal_of(self)


@dataclass(frozen=True)
class RedisConfig:
    """A shared Redis server or Redis Cluster; memory limits and eviction are the server's."""

    url: str | None = None
    """Server address: ``redis://host:port/db``, ``rediss://`` (TLS, options as query
    parameters) or ``unix:///path``; a password in it is accepted, but printed as ``***``.
    Defaults to ``redis://127.0.0.1:6379/0`` unless ``cluster_nodes`` is given."""
    cluster_nodes: tuple[str, ...] | None = None
    """A Redis Cluster (or Valkey cluster) instead of one server: some of its nodes, each
    ``host:port`` or a ``redis://`` / ``rediss://`` URL (all with the same scheme, login
    and options), from which the client learns the rest; never with ``url``."""
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
    username: str | None = None
    """ACL user (Redis 6+), unless the URL names one; None is the default user."""
    password_file: str | None = None
    """A file holding the password (a final line break is dropped), read when the tier is
    built; keeps the secret out of the URL and the config."""
    password_env: str | None = None
    """An environment variable holding the password (instead of ``password_file``)."""
    secret_file: str | None = None
    """A file holding the secret that authenticates records (HMAC-SHA256), so that no
    client of the server without it can forge a chunk; every kvtier process sharing the
    namespace needs the same one."""
    secret_env: str | None = None
    """An environment variable holding that secret (instead of ``secret_file``)."""
    encrypt: bool = False
    """Encrypt records with AES-GCM under the secret (needs it, and ``kvtier[crypto]``)."""

    def __post_init__(self) -> None:
        if isinstance(self.password_file, Path):
            object.__setattr__(self, "password_file", str(self.password_file))
        for name in ("username", "password_file", "password_env"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"[redis].{name}: must be a non-empty string, got {value!r}")
        self._check_address()
        if not isinstance(self.namespace, str) or not self.namespace.strip():
            raise ValueError(f"[redis].namespace: must be a non-empty string, got "
                             f"{self.namespace!r}")
        check_number("[redis].timeout_s", self.timeout_s, low=1e-3, high=MAX_TIMEOUT_S)
        check_number("[redis].backoff_initial_s", self.backoff_initial_s, low=0)
        check_number("[redis].backoff_max_s", self.backoff_max_s, low=self.backoff_initial_s)
        if self.ttl_s is not None:
            check_number("[redis].ttl_s", self.ttl_s, low=1, high=MAX_TTL_S, integer=True)
        check_number("[redis].workers", self.workers, low=1, integer=True)
        self.password()  # a missing file or variable fails here, not at the first call
        _check_secret(self, "[redis]")

    def _check_address(self) -> None:
        """``url`` or ``cluster_nodes`` (one, the default URL with neither), checked."""
        login = {"username": self.username is not None,
                 "password": self.password_file is not None or self.password_env is not None}
        if self.cluster_nodes is None:
            url = DEFAULT_URL if self.url is None else self.url
            object.__setattr__(self, "url", check_url(url, "[redis].url", **login))
        elif self.url is not None:
            raise ValueError("[redis]: give url (one server) or cluster_nodes (a cluster), "
                             "not both")
        else:
            object.__setattr__(self, "cluster_nodes", check_cluster_nodes(
                self.cluster_nodes, "[redis].cluster_nodes", **login))
            check_cluster_namespace(self.namespace, "[redis].namespace")

    def seal(self) -> Seal | None:
        """How records are protected (the secret read now): ``kvtier.tiers.records.seal``."""
        return _seal_of(self)

    def password(self) -> str | None:
        """The password from ``password_file`` or ``password_env`` (read now), or None."""
        return read_password(self.password_file, self.password_env, "[redis]")

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown["url"] = None if self.url is None else redact(self.url)
        if self.cluster_nodes is not None:
            shown["cluster_nodes"] = tuple(redact(n) for n in self.cluster_nodes)
        return f"RedisConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def _check_secret(cfg: DiskConfig | RedisConfig, where: str) -> None:
    """The secret fields: strings, at most one source, ``encrypt`` only with one; the
    secret is read now, so a missing file or variable fails here, not at the first call."""
    for name in ("secret_file", "secret_env"):
        value = getattr(cfg, name)
        if isinstance(value, Path):
            object.__setattr__(cfg, name, value := str(value))
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{where}.{name}: must be a non-empty string, got {value!r}")
    if cfg.secret_file is not None and cfg.secret_env is not None:
        raise ValueError(f"{where}: give secret_file or secret_env, not both")
    if not isinstance(cfg.encrypt, bool):
        raise ValueError(f"{where}.encrypt: must be true or false, got {cfg.encrypt!r}")
    if cfg.encrypt and cfg.secret_file is None and cfg.secret_env is None:
        raise ValueError(f"{where}.encrypt: needs a key: set secret_file or secret_env")
    try:
        _seal_of(cfg)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _seal_of(cfg: DiskConfig | RedisConfig) -> Seal | None:
    from kvtier.tiers.records.seal import seal_for  # loaded only by configs that name a secret

    return seal_for(cfg.secret_file, cfg.secret_env, cfg.encrypt)


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
    admit_after: int = 1
    """Admission to the hierarchy: store a new chunk only at its ``admit_after``-th offer
    within the last ``admit_window`` offers (1: every offer, no filter). It gates what
    enters host memory; the tiers below receive what host memory evicts (or, under
    write-through, what it admitted), so one setting serves every tier
    (``kvtier.store.admission``)."""
    admit_window: int | None = None
    """Offers admission remembers (fixed memory, at most about 150 bytes each); None: 4
    per host slot."""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            value = getattr(self, name)
            if not (value is None and name != "host") and not isinstance(value, cls):
                raise ValueError(f"[{name}]: expected a {cls.__name__}, got {value!r}")
        _check_choice("write_policy", self.write_policy, get_args(WritePolicy))
        check_number("miss_ttl_s", self.miss_ttl_s, low=0)
        self.admission()  # a bad admit_after or admit_window fails here

    def admission(self) -> Admission:
        """When the hierarchy stores a new chunk (``admit_after``, ``admit_window``)."""
        return Admission(self.admit_after, self.admit_window)

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
