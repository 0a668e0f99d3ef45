"""Deprecated: the tier configuration moved to ``kvtier.store.config``.

``from kvtier import TierConfig`` (or ``kvtier.store.config``) is the import to use; this
module keeps old imports working for one release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings

from kvtier.store.config import *  # noqa: F403
from kvtier.store.config import __all__  # noqa: F401

warnings.warn(
    "kvtier.config moved to kvtier.store.config (or import TierConfig from kvtier); "
    "the old path will be removed in a later release",
    DeprecationWarning,
    stacklevel=2,
)
