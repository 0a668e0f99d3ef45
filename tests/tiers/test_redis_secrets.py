"""Passwords never printed, whatever they hold and wherever they are given (issue 29): one
redaction (``options.redact``) for single URLs, node lists and messages quoting them; every
builder's error (``RedisConfig``, ``RedisTier``, cluster nodes, ``kvtier replay --redis``)
shows it; a password given twice is refused without being printed."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.cli.main import main
from kvtier.tiers.config import RedisConfig
from kvtier.tiers.redis.options import hide, redact
from kvtier.tiers.redis.tier import RedisTier

PW = "Hunter2Zq"

REDACTED = {
    f"redis://:{PW}#x@127.0.0.1:6398/0": "redis://:***@127.0.0.1:6398/0",
    f"redis://:{PW}?1@127.0.0.1:6398/0": "redis://:***@127.0.0.1:6398/0",
    f"redis://u:{PW}/x@h:1/0": "redis://u:***@h:1/0",
    f"redis://u:{PW}@x@h:1/0": "redis://u:***@h:1/0",
    f"redis://127.0.0.1:6398/0?PASSWORD={PW}": "redis://127.0.0.1:6398/0?PASSWORD=***",
    f"redis://h/0?Password={PW}&db=1": "redis://h/0?Password=***&db=1",
    f"redis://h/0?db=1&pass%77ord={PW}": "redis://h/0?db=1&pass%77ord=***",
    f"redis://h/0?password={PW}#frag": "redis://h/0?password=***",
    f"redis://h/0?password={PW}?x=1": "redis://h/0?password=***",
    f"redis://h/0?auth_token={PW}&x=1": "redis://h/0?auth_token=***&x=1",
    f"redis://h/0?SECRET={PW}": "redis://h/0?SECRET=***",
    f"redis://h/0?pwd={PW}": "redis://h/0?pwd=***",
    f"rediss://h/0?ssl_password={PW}": "rediss://h/0?ssl_password=***",
    f"['redis://:{PW}@a:1', 'redis://:{PW}2@b:2']": "['redis://:***@a:1', 'redis://:***@b:2']",
    f"u:{PW}@host:7000": "u:***@host:7000",
    "redis://kv://00@h:1/0": "redis://kv:***@h:1/0",  # a password that looks like a scheme
    "redis://user@host:6379/0": "redis://user@host:6379/0",
    "redis://host:6379/0?db=1&client_name=me": "redis://host:6379/0?db=1&client_name=me",
}
"""The issue's cases and their neighbours, and (the last two) what must stay readable."""


@pytest.mark.parametrize("url", sorted(REDACTED))
def test_redact_hides_the_password_whatever_it_holds_and_keeps_the_rest(url: str) -> None:
    assert redact(url) == REDACTED[url]


PASSWORDS = st.text(st.sampled_from("abcXYZ019#?@/:%&=;+~!$"), min_size=4, max_size=16).filter(
    lambda p: p.strip("@") and "abc" not in p)


@settings(max_examples=200, deadline=None)
@given(password=PASSWORDS, user=st.sampled_from(["", "kv"]), encoded=st.booleans())
def test_a_password_in_the_user_part_never_shows(password: str, user: str, encoded: bool) -> None:
    written = quote(password, safe="") if encoded else password
    url = f"redis://{user}:{written}@abc.example:6379/0?db=0"
    shown = redact(url)
    assert written not in shown and shown.startswith(f"redis://{user}:***@")


@settings(max_examples=200, deadline=None)
@given(password=PASSWORDS.filter(lambda p: not set(p) & set("&;")),
       name=st.sampled_from(["password", "PASSWORD", "Pass", "pwd", "token", "AUTH", "secret"]))
def test_a_password_in_the_query_never_shows(password: str, name: str) -> None:
    url = f"redis://abc.example:6379/0?db=0&{name}={password}"
    assert password not in redact(url) and redact(f"nodes: [{url!r}, {url!r}]").count("***") == 2


BUILDERS: dict[str, Callable[[str], object]] = {
    "RedisTier(url)": lambda u: RedisTier(u),
    "RedisConfig(url)": lambda u: RedisConfig(url=u),
    "RedisTier(cluster_nodes)": lambda u: RedisTier(cluster_nodes=[u, "10.0.0.9:7000"]),
    "RedisConfig(cluster_nodes)": lambda u: RedisConfig(cluster_nodes=[u]),
}
REFUSED = {
    f"redis://:{PW}#x@127.0.0.1:6398/0": "percent-encode them",
    f"redis://:{PW}?1@127.0.0.1:6398/0": "percent-encode them",
    f"redis://:{PW}/1@127.0.0.1:6398/0": "percent-encode them",
    f"redis://127.0.0.1:6398/0?PASSWORD={PW}": "names are lower case",
    f"redis://127.0.0.1:6398/0?Password={PW}": "names are lower case",
    f"redis://:{PW}@127.0.0.1:6398/0?password={PW}": "the password is given twice",
    f"redis://127.0.0.1:6398/0?password={PW}&password={PW}": "'password' is given twice",
    f"redis://127.0.0.1:6398/0?password={PW}&PassWord=other": "names are lower case",
}


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("url", sorted(REFUSED))
def test_every_builder_refuses_with_the_password_hidden(url: str, builder: str) -> None:
    with pytest.raises(ValueError) as caught:
        BUILDERS[builder](url)
    message = str(caught.value)
    assert PW not in message and "***" in message
    if "cluster" not in builder:  # a node is first refused for the shape of its address
        assert REFUSED[url] in message


@pytest.mark.parametrize("url", sorted(REFUSED))
def test_kvtier_replay_refuses_with_the_password_hidden(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["replay", "--model", "llama-3.1-8b", "--limit", "3", "--bytes",
                 "--redis", url])
    out, err = capsys.readouterr()
    assert code == 2 and PW not in out + err and REFUSED[url] in err


def test_a_password_given_apart_and_in_the_query_is_refused() -> None:
    with pytest.raises(ValueError, match="the password is given twice") as caught:
        RedisTier(f"redis://h/0?password={PW}", password="other")
    assert PW not in str(caught.value)


def test_what_a_server_says_back_is_printed_without_the_secrets() -> None:
    said = f"WRONGPASS HELLO 3 AUTH default {PW}#x to redis://:{PW}@h/0?token=t0k3n"
    assert hide(said, (f"{PW}#x",)) == "WRONGPASS HELLO 3 AUTH default *** to redis://:***@h/0?token=***"
