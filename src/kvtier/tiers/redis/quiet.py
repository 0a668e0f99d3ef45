"""redis-py's own log records, with the secrets of every open Redis tier hidden.

kvtier hides a tier's secrets from what it logs and reports (``options.hide``). redis-py
logs too: from 8.2 on, at DEBUG, the text of an ``AuthenticationError`` with the
connection it came on, and a server may make that text quote the ``AUTH`` command it
was sent, password and all (``tests/tiers/test_hostile_redis.py``, "password echoed").
An operator who turns on DEBUG to find a fault must not find the password in the log.

While a tier is open (``watch`` in ``RedisTier.__init__``, ``unwatch`` in its ``close``),
``SECRETS``, a ``logging.Filter``, sits on every logger of redis-py's (``redis`` and
``redis.*``) and rewrites each record they make: its message with every open tier's
secrets shown as ``***`` (and URLs redacted), its exception text likewise. A filter on a
logger sees the records made on that logger only, so it is added to each one, those that
exist when a tier opens (redis-py makes its loggers when its modules are imported).

>>> import logging
>>> record = logging.LogRecord("redis.connection", logging.DEBUG, "", 0,
...                            "error: %s", ("WRONGPASS AUTH default s3cret",), None)
>>> f = SecretFilter(); f.add(("s3cret",)); f.filter(record), record.getMessage()
(True, 'error: WRONGPASS AUTH default ***')
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence

from kvtier.tiers.redis.options import hide


class SecretFilter(logging.Filter):
    """Hides the secrets it holds (counted: two tiers may share one) from records."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._secrets: tuple[str, ...] = ()  # longest first, as options.secrets_of orders them

    def add(self, secrets: Sequence[str]) -> None:
        with self._lock:
            self._counts.update(s for s in secrets if s)
            self._sort()

    def discard(self, secrets: Sequence[str]) -> None:
        with self._lock:
            self._counts.subtract(s for s in secrets if s)
            self._counts = +self._counts  # drop those no open tier holds
            self._sort()

    def _sort(self) -> None:
        self._secrets = tuple(sorted(self._counts, key=len, reverse=True))

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = self._secrets
        if not secrets:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format: left to logging to report
            return True
        shown = hide(text, secrets)
        if shown != text:
            record.msg, record.args = shown, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = hide(record.exc_text, secrets)
        return True


SECRETS = SecretFilter()
"""The one filter on redis-py's loggers."""


def watch(secrets: Sequence[str]) -> None:
    """Hide ``secrets`` from redis-py's log records until ``unwatch`` of the same."""
    if not secrets:
        return
    SECRETS.add(secrets)
    try:
        import redis  # noqa: F401  (its modules make their loggers)
    except ImportError:  # no redis-py: no record of its to hide from
        return
    for name in list(logging.root.manager.loggerDict):
        if name == "redis" or name.startswith("redis."):
            logger = logging.getLogger(name)
            if SECRETS not in logger.filters:
                logger.addFilter(SECRETS)


def unwatch(secrets: Sequence[str]) -> None:
    """The tier that ``watch``-ed ``secrets`` is closed."""
    SECRETS.discard(secrets)
