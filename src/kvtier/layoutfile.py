"""Layouts from TOML or JSON files.

```toml
hit_granularity = 256          # optional
model = "my-model"             # optional

[[groups]]
kind = "full"
tokens_per_block = 16
blocks_per_chunk = 16
bytes_per_token = 131072

[[groups]]
kind = "sliding_window"
tokens_per_block = 16
blocks_per_chunk = 16
window = 128
extra_retained = 3
```

Unknown keys are rejected with the list of known ones; every value is checked by
``Group`` and ``Layout`` at construction.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from kvtier.layout import Group, Layout

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

GROUP_KEYS = tuple(f.name for f in fields(Group))
LAYOUT_KEYS = ("groups", "hit_granularity", "model", "kv_dtype")
MAX_LAYOUT_BYTES = 2**20
"""The largest layout file read (1 MiB; a layout of a hundred groups is a few KiB)."""


def load_layout(path: str | Path) -> Layout:
    """Read a layout from a ``.toml`` or ``.json`` file; ValueError names what is wrong."""
    path = Path(path)
    text = _read(path)
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except ValueError as e:  # malformed, or an integer of more than 4300 digits
        raise ValueError(f"layout file {path} is not valid {_fmt(path)}: {e}") from None
    except RecursionError:
        raise ValueError(f"layout file {path} is nested too deeply; a layout is a table of "
                         "'groups' tables") from None
    try:
        return layout_from_dict(data)
    except ValueError as e:
        raise ValueError(f"layout file {path}: {e}") from None


def _read(path: Path) -> str:
    """The file's text; ValueError if unreadable, not UTF-8 or over ``MAX_LAYOUT_BYTES``."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_LAYOUT_BYTES + 1)
    except OSError as e:
        raise ValueError(f"cannot read layout file {path}: {e.strerror or e}") from None
    if len(raw) > MAX_LAYOUT_BYTES:
        raise ValueError(f"layout file {path} is over {MAX_LAYOUT_BYTES} bytes; a layout is a "
                         "few groups")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"layout file {path} is not UTF-8 text ({e.reason} at byte "
                         f"{e.start})") from None


def _fmt(path: Path) -> str:
    return "JSON" if path.suffix == ".json" else "TOML"


def layout_from_dict(data: Any) -> Layout:
    """Build a layout from plain data (the parsed file)."""
    if not isinstance(data, dict):
        raise ValueError("the top level must be a table with a 'groups' list")
    _reject_unknown(data, LAYOUT_KEYS, "top level")
    groups = data.get("groups")
    if not isinstance(groups, list) or not groups:
        raise ValueError("'groups' must be a non-empty list of tables")
    built = tuple(_group(i, g) for i, g in enumerate(groups))
    extra = {k: data[k] for k in ("hit_granularity", "model", "kv_dtype") if k in data}
    for key in ("model", "kv_dtype"):
        if key in extra and not isinstance(extra[key], str):
            raise ValueError(f"'{key}' must be a string")
    return Layout(built, **extra)


def _group(index: int, data: Any) -> Group:
    if not isinstance(data, dict):
        raise ValueError(f"groups[{index}] must be a table")
    _reject_unknown(data, GROUP_KEYS, f"groups[{index}]")
    if "kind" not in data or "tokens_per_block" not in data:
        raise ValueError(f"groups[{index}] needs at least 'kind' and 'tokens_per_block'")
    if "name" in data and not isinstance(data["name"], str):
        raise ValueError(f"groups[{index}]: name must be a string")
    try:
        return Group(**data)
    except ValueError as e:
        raise ValueError(f"groups[{index}]: {e}") from None


def _reject_unknown(data: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known keys are {list(known)}")
