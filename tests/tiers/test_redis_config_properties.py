"""Generated hostile Redis settings: whatever URL, numbers or option values a config holds,
``RedisConfig`` and ``RedisTier`` either refuse them with a ``ValueError`` that does not
show the password, or accept them, and then redis-py builds a connection from the URL
without an error (nothing left to fail at first use) and no repr shows the password."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.tiers.config import RedisConfig, TierConfig
from kvtier.tiers.redis.tier import RedisTier

SECRET = "Zq9SeCrEt"
NASTY = ["", ":", "::", "@", "/", "?", "#", "[", "]", "[::1]", "%", "%zz", "&", "=", " ",
         "\n", "\x00", "é", "-1", "0", "65535", "65536", "999999", "1e3", "abc", "..", "//"]
fragment = st.one_of(st.sampled_from(NASTY), st.text(max_size=8))


@st.composite
def urls(draw: st.DrawFn) -> str:
    """A URL built from plausible and nasty parts, with ``SECRET`` as its password (in the
    user part or the query) or anywhere else."""
    scheme = draw(st.sampled_from(["redis", "rediss", "unix", "http", "REDIS", ""]))
    user = draw(st.sampled_from(["", "user", "user:" + SECRET, ":" + SECRET]))
    host = draw(st.one_of(st.sampled_from(["cache", "127.0.0.1", "[::1]", ""]), fragment))
    port = draw(st.one_of(st.sampled_from(["", ":6379", ":0", ":70000"]),
                          fragment.map(lambda f: ":" + f)))
    path = draw(st.one_of(st.sampled_from(["", "/", "/0", "/15", "/abc", "/run/r.sock"]),
                          fragment.map(lambda f: "/" + f)))
    options = draw(st.lists(st.one_of(
        st.sampled_from(["db=1", "db=x", "password=" + SECRET, "ssl_cert_reqs=required",
                         "ssl_check_hostname=no", "ssl_ca_certs=/ca.pem", "socket_timeout=1",
                         "client_name=kv", "ssl_password=" + SECRET]),
        st.tuples(fragment, fragment).map("=".join)), max_size=3))
    query = "?" + "&".join(options) if options else ""
    return f"{scheme}://{user}{'@' if user else ''}{host}{port}{path}{query}"


def accepted_or_refused(build: Any) -> object | None:
    """``build()``, or None if it refused with a ValueError that hides the secret."""
    try:
        return build()
    except ValueError as e:
        assert SECRET not in str(e)
        return None


@settings(max_examples=400, deadline=None)
@given(urls())
def test_any_url_is_refused_cleanly_or_connectable(url: str) -> None:
    redis = pytest.importorskip("redis")
    cfg = accepted_or_refused(lambda: RedisConfig(url=url))
    tier = accepted_or_refused(lambda: RedisTier(url))
    assert (cfg is None) == (tier is None)  # one check, one answer
    if isinstance(cfg, RedisConfig) and isinstance(tier, RedisTier):
        assert SECRET not in repr(cfg) + tier.url
        pool = redis.Redis.from_url(url).connection_pool
        conn = pool.make_connection()  # builds, does not connect
        assert isinstance(conn.db, int) and conn.db >= 0


numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                    st.sampled_from([math.inf, -math.inf, math.nan, 2**63, 10**400, True]),
                    st.text(max_size=3), st.none())


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["timeout_s", "backoff_initial_s", "backoff_max_s", "ttl_s",
                        "workers"]), numbers)
def test_any_number_is_refused_cleanly_or_finite(field: str, value: object) -> None:
    cfg = accepted_or_refused(lambda: RedisConfig(**{field: value}))
    if isinstance(cfg, RedisConfig):
        given_value = getattr(cfg, field)
        assert given_value is None or math.isfinite(given_value)
    whole = accepted_or_refused(lambda: TierConfig.from_dict(
        {"host": {"capacity": "1MiB"}, "miss_ttl_s": value}))
    assert whole is None or math.isfinite(whole.miss_ttl_s)  # type: ignore[attr-defined]
