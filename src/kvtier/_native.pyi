# Types of the C module built by KVTIER_COMPILE=1 (src/kvtier/_native.c says what each does).
from typing import Any

import numpy as np
from typing_extensions import Buffer

_Bytes = Buffer | np.ndarray[Any, Any]

def copy(
    dst: _Bytes, src: _Bytes, lengths: _Bytes, cursor: _Bytes | None = None, grain: int = 1, /
) -> None: ...
def cpu() -> int: ...
def sha256_start(seed: _Bytes, /) -> bytearray: ...
def sha256_spine(
    state: bytearray, data: _Bytes, filled: int, step: int, /
) -> tuple[list[bytes], int]: ...
def prefixed(prefix: _Bytes, items: list[bytes], /) -> list[bytes]: ...
