"""Logging in to Redis without leaking the secret: a password in the URL, in a file or in
an environment variable (and an ACL user); a wrong or missing password reported as such;
and the password never in a repr, an error message, a log line or ``kvtier replay``'s
output (a real ``redis-server --requirepass``)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tier_helpers import GEOMETRY, SLOT, Clock, RedisServer, free_port, items, key, payload

from kvtier.cli.main import main
from kvtier.tiers.build import TIER_BUILDERS
from kvtier.tiers.config import HostConfig, RedisConfig, TierConfig
from kvtier.tiers.redis.options import redact
from kvtier.tiers.redis.tier import RedisTier

SECRET = "s3cr3t-Pw_42"
WRONG = "Wr0ng-Pw_17"
ENV = "KVTIER_TEST_REDIS_PASSWORD"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server that wants ``SECRET`` from every client."""
    from tier_helpers import REDIS_SERVER

    if REDIS_SERVER is None:
        pytest.skip("redis-server is not on PATH (CI installs Debian's redis-server package)")
    srv = RedisServer(tmp_path, password=SECRET)
    srv.start()
    yield srv
    srv.stop()


def with_password(server: RedisServer, password: str = SECRET, user: str = "") -> str:
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


def from_config(cfg: RedisConfig) -> RedisTier:
    """The tier ``TieredStore.from_config`` would build for ``cfg``."""
    tier = TIER_BUILDERS["redis"](cfg, SLOT, GEOMETRY, Clock())
    assert isinstance(tier, RedisTier)
    return tier


def round_trip(tier: RedisTier) -> bool:
    """Whether a chunk written through ``tier`` reads back intact."""
    try:
        tier.put(items("a"))
        got = tier.get([key("a")])
        return key("a") in got and bytes(got[key("a")]) == payload("a")
    finally:
        tier.close()


# ---- where the password comes from ------------------------------------------------------

@pytest.mark.redis
def test_password_in_the_url(server: RedisServer) -> None:
    assert round_trip(RedisTier(with_password(server), geometry=GEOMETRY))


@pytest.mark.redis
def test_password_from_a_file(server: RedisServer, tmp_path: Path) -> None:
    secret = tmp_path / "redis.pw"
    secret.write_text(SECRET + "\n")  # as an editor or `echo` leaves it
    assert round_trip(from_config(RedisConfig(url=server.url, password_file=str(secret))))


@pytest.mark.redis
def test_password_from_the_environment(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, SECRET)
    assert round_trip(from_config(RedisConfig(url=server.url, password_env=ENV)))


@pytest.mark.redis
def test_an_acl_user_by_name_in_the_config_or_the_url(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin: Any = server.client()
    admin.acl_setuser("alice", enabled=True, passwords=["+alice-pw"], keys=["*"],
                      commands=["+@all"])
    monkeypatch.setenv(ENV, "alice-pw")
    cfg = RedisConfig(url=server.url, username="alice", password_env=ENV)
    assert round_trip(from_config(cfg))
    assert round_trip(RedisTier(with_password(server, "alice-pw", "alice"), geometry=GEOMETRY))


# ---- a refused login says so ------------------------------------------------------------

@pytest.mark.redis
@pytest.mark.parametrize("password", [WRONG, None])
def test_a_wrong_or_missing_password_says_authentication_failed(
    server: RedisServer, password: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    url = server.url if password is None else with_password(server, password)
    tier = RedisTier(url, geometry=GEOMETRY, clock=Clock())
    with caplog.at_level(logging.WARNING, logger="kvtier.tiers.redis.tier"):
        assert tier.get([key("a")]) == {} and tier.put(items("a")) == []
    assert tier.last_error is not None
    assert tier.last_error.startswith("authentication failed")
    assert [r.getMessage().count("authentication failed") for r in caplog.records] == [1]
    assert WRONG not in caplog.text and WRONG not in tier.last_error and WRONG not in tier.url


def test_a_server_that_is_not_there_does_not_answer() -> None:
    tier = RedisTier(f"redis://:{SECRET}@127.0.0.1:{free_port()}/0", timeout_s=0.2,
                     clock=Clock())
    assert tier.get([key("a")]) == {}
    assert tier.last_error is not None and tier.last_error.startswith(
        "the server does not answer")


# ---- the secret never printed -----------------------------------------------------------

def test_redact_hides_every_password_and_keeps_the_rest() -> None:
    cases = {
        "redis://user:secret@host:6379/0": "redis://user:***@host:6379/0",
        "redis://:secret@host/0": "redis://:***@host/0",
        "redis://user@host/0": "redis://user@host/0",
        "redis://user:p@ss:w0rd@host/0": "redis://user:***@host/0",
        "redis://host/0?password=secret&db=1": "redis://host/0?password=***&db=1",
        "redis://host/0?db=1&pass%77ord=secret": "redis://host/0?db=1&pass%77ord=***",
        "rediss://host/0?ssl_password=secret": "rediss://host/0?ssl_password=***",
        "unix://:secret@/run/redis.sock?db=2": "unix://:***@/run/redis.sock?db=2",
        "redis://u:secret@host:notaport/0": "redis://u:***@host:notaport/0",
        "redis://host:6379/0": "redis://host:6379/0",
    }
    assert {url: redact(url) for url in cases} == cases


def test_the_config_repr_hides_the_password() -> None:
    cfg = RedisConfig(url=f"redis://user:{SECRET}@cache:6379/0")
    whole = TierConfig(HostConfig("1MiB"), redis=cfg)
    for text in (repr(cfg), str(cfg), repr(whole)):
        assert SECRET not in text and "redis://user:***@cache:6379/0" in text


@pytest.mark.parametrize("url", [f"redis://u:{SECRET}@cache:notaport/0",
                                 f"redis://:{SECRET}@cache/abc", f"http://:{SECRET}@cache/0",
                                 f"redis://cache/0?password={SECRET}&oops=1"])
def test_an_error_about_the_url_hides_the_password(url: str) -> None:
    for build in (lambda: RedisTier(url), lambda: RedisConfig(url=url)):
        with pytest.raises(ValueError, match=r"\*\*\*") as caught:
            build()
        assert SECRET not in str(caught.value)


@pytest.mark.redis
def test_replay_output_hides_the_password(
    server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = with_password(server)
    code = main(["replay", "--model", "llama-3.1-8b", "--limit", "5", "--bytes",
                 "--redis", url, "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and SECRET not in out + err
    assert json.loads(out)["bytes"]["redis"] == redact(url) == url.replace(SECRET, "***")
    code = main(["replay", "--model", "llama-3.1-8b", "--limit", "5", "--bytes",
                 "--redis", url])
    out, err = capsys.readouterr()
    assert code == 0 and SECRET not in out + err


@pytest.mark.redis
def test_replay_says_a_login_failed(
    server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["replay", "--model", "llama-3.1-8b", "--limit", "5", "--bytes",
                 "--redis", with_password(server, WRONG)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "authentication failed" in err and ":***@" in err and WRONG not in err


def test_the_command_says_one_line_when_the_server_is_not_there() -> None:
    """Its own process, so no test harness catches the tier's log warning: the library adds
    no line of its own to the command's one-line error."""
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    done = subprocess.run([sys.executable, "-m", "kvtier", "replay", "--model", "llama-3.1-8b",
                           "--limit", "3", "--bytes", "--redis", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "the server does not answer" in done.stderr and SECRET not in done.stderr


# ---- where the password may come from: one source, a readable one -----------------------

@pytest.mark.parametrize(("options", "message"), [
    ({"password_file": "/no/such/file"}, r"password_file: cannot read /no/such/file"),
    ({"password_env": "KVTIER_TEST_UNSET_VARIABLE"},
     r"environment variable KVTIER_TEST_UNSET_VARIABLE is empty or unset"),
    ({"password_file": "{empty}"}, r"password_file .* is empty"),
    ({"password_file": "/dev/zero"}, r"cannot read /dev/zero \(not a regular file\)"),
    ({"password_file": "{dir}"}, r"cannot read .* \(not a regular file\)"),
    ({"password_file": "{big}"}, r"longer than 4096 bytes: not a password file"),
    ({"password_file": "{binary}"}, r"cannot read .* \(not UTF-8 text\)"),
    ({"password_file": "{file}", "password_env": ENV}, "password_file or password_env, not both"),
    ({"url": "redis://:pw@cache/0", "password_env": ENV}, "the password is given twice"),
    ({"url": "redis://cache/0?password=pw", "password_file": "{file}"},
     "the password is given twice"),
    ({"url": "redis://bob@cache/0", "username": "alice"}, "the username is given twice"),
    ({"username": ""}, r"\[redis\].username: must be a non-empty string"),
    ({"password_env": 3}, r"\[redis\].password_env: must be a non-empty string"),
])
def test_a_password_source_that_cannot_serve_is_refused_when_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], message: str
) -> None:
    monkeypatch.setenv(ENV, SECRET)
    monkeypatch.delenv("KVTIER_TEST_UNSET_VARIABLE", raising=False)
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "file").write_text(SECRET)
    (tmp_path / "big").write_text(SECRET * 1000)
    (tmp_path / "binary").write_bytes(b"\xff\xfe" + SECRET.encode())
    paths = {name: tmp_path / name for name in ("empty", "file", "big", "binary")}
    paths["dir"] = tmp_path
    values: dict[str, Any] = {k: v.format(**paths) if isinstance(v, str) else v
                              for k, v in options.items()}
    with pytest.raises(ValueError, match=message) as caught:
        RedisConfig(**values)
    assert SECRET not in str(caught.value)


def test_a_password_given_twice_to_the_tier_is_refused() -> None:
    with pytest.raises(ValueError, match="the password is given twice"):
        RedisTier("redis://:pw@cache/0", password="other")
