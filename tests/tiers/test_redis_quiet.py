"""redis-py's own log records hide the secrets of every open Redis tier
(``kvtier.tiers.redis.quiet``): redis-py 8.2 logs an ``AuthenticationError``'s text at
DEBUG, which a hostile server makes quote the password (the end-to-end case is
``test_hostile_redis.py``'s "password echoed"). Records are made here on redis-py's real
loggers, as redis-py makes them; no server is needed (a tier connects on first use)."""

from __future__ import annotations

import doctest
import logging
from urllib.parse import quote

import pytest

import kvtier.tiers.redis.quiet as quiet
from kvtier.tiers.redis.tier import RedisTier

PW = "Hunter2Zq#x@/?"
OTHER = "s3cond-Pw"


@pytest.fixture(autouse=True)
def fresh_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filter of this test's own on redis-py's loggers: tiers other tests left open keep
    their secrets in the process-wide one, and hiding them redacts URL-like text too."""
    monkeypatch.setattr(quiet, "SECRETS", quiet.SecretFilter())
    for name in list(logging.root.manager.loggerDict):
        if name == "redis" or name.startswith("redis."):
            monkeypatch.setattr(logging.getLogger(name), "filters", [])


def tier(password: str) -> RedisTier:
    return RedisTier(f"redis://:{quote(password, safe='')}@127.0.0.1:1/0", timeout_s=0.1)


def logged(caplog: pytest.LogCaptureFixture, name: str, text: str) -> str:
    """What ``caplog`` shows of one DEBUG record made on logger ``name``, ``%s`` of text."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        logging.getLogger(name).debug("AuthenticationError, error: %s", text)
    return caplog.text + "".join(str(r.args) for r in caplog.records)


@pytest.mark.parametrize("logger", ["redis.connection", "redis.cluster", "redis"])
def test_an_open_tiers_password_is_hidden_from_redis_py_records(
        caplog: pytest.LogCaptureFixture, logger: str) -> None:
    before = logged(caplog, logger, f"3 AUTH default {PW}")
    assert PW in before  # the negative control: no tier open, nothing is hidden
    first = tier(PW)
    try:
        shown = logged(caplog, logger, f"3 AUTH default {PW} and {quote(PW, safe='')}")
        assert PW not in shown and quote(PW, safe="") not in shown
        assert "3 AUTH default *** and ***" in shown
        assert OTHER in logged(caplog, logger, OTHER)  # only the open tiers' secrets
    finally:
        first.close()
    assert PW in logged(caplog, logger, PW)  # closed: its secret is no longer held


def test_a_secret_two_tiers_share_stays_hidden_until_both_close(
        caplog: pytest.LogCaptureFixture) -> None:
    a, b = tier(PW), tier(PW)
    a.close()
    assert PW not in logged(caplog, "redis.connection", PW)
    b.close()
    assert PW in logged(caplog, "redis.connection", PW)


def test_exception_text_is_hidden_too(caplog: pytest.LogCaptureFixture) -> None:
    t = tier(PW)
    try:
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            try:
                raise ConnectionError(f"WRONGPASS AUTH default {PW}")
            except ConnectionError:
                logging.getLogger("redis.connection").debug("failed", exc_info=True)
        assert "WRONGPASS AUTH default ***" in caplog.text
        assert PW not in caplog.text
    finally:
        t.close()


def test_kvtiers_own_and_other_loggers_are_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    t = tier(PW)
    try:
        assert quiet.SECRETS not in logging.getLogger("kvtier.tiers.redis.tier").filters
        assert quiet.SECRETS in logging.getLogger("redis.connection").filters
        assert PW in logged(caplog, "someone.else", PW)  # not redis-py's: not touched
    finally:
        t.close()


def test_doctests() -> None:
    assert doctest.testmod(quiet).failed == 0
