"""What a Redis tier is given, checked before any connection: the server's URL (or a
Redis Cluster's start-up nodes), its printable form with every secret hidden, a password
from a file or the environment, and the bounds of its numbers.

One check serves ``RedisConfig`` and ``RedisTier`` alike (``check_url``): redis-py would
accept ``redis://host:notaport`` or ``redis://host/abc`` (silently database 0) and fail, or
connect somewhere else, on first use. Secrets never leave through a message or a log line:
everything kvtier prints shows ``redact(url)``.

>>> redact("redis://user:secret@cache:6379/0")
'redis://user:***@cache:6379/0'
>>> redact("rediss://cache/0?password=secret&ssl_ca_certs=/etc/ca.pem")
'rediss://cache/0?password=***&ssl_ca_certs=/etc/ca.pem'
>>> check_url("redis://cache:notaport/0", "url")
Traceback (most recent call last):
...
ValueError: url: port must be an integer in 1..65535, got 'redis://cache:notaport/0'
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit

from kvtier.tiers.records.seal import read_secret_file

DEFAULT_URL = "redis://127.0.0.1:6379/0"
"""The server a Redis tier talks to when given neither a URL nor cluster nodes."""
MAX_TTL_S = 10**15
"""The longest ``ttl_s``: Redis refuses (and kvtier would refuse every write) an expiry past
2**63 milliseconds from 1970; 10**15 s, thirty million years, stays clear of that."""
MAX_TIMEOUT_S = 3600.0
"""The longest ``timeout_s``: sockets refuse timeouts past the platform's time_t."""

_SCHEMES = ("redis", "rediss", "unix")
_SHAPE = "redis://host:port/db, rediss://host:port/db or unix:///path/to/redis.sock?db=0"
_TRUTH = ("true", "false", "yes", "no", "1", "0")
_QUERY: dict[str, tuple[str, ...] | None] = {
    "db": None, "password": None, "username": None, "client_name": None,
}
"""Query options every scheme takes (None: any text; ``db`` is checked apart)."""
_TLS_QUERY: dict[str, tuple[str, ...] | None] = {
    "ssl_ca_certs": None, "ssl_ca_path": None, "ssl_certfile": None, "ssl_keyfile": None,
    "ssl_password": None, "ssl_cert_reqs": ("none", "optional", "required"),
    "ssl_check_hostname": _TRUTH,
}
"""Query options of ``rediss://`` only: redis-py's ``SSLConnection`` parameters."""
_SECRET_WORDS = ("pass", "pwd", "token", "secret", "auth")
"""An option whose name (any case, percent-decoded) holds one of these is a secret."""
_Fault = Callable[[str], ValueError]
"""Makes the ValueError of a bad URL from what is wrong with it."""
_SCHEME = re.compile(r"(?<![^\s'\"`()\[\]{}<>,;=])[A-Za-z][A-Za-z0-9+.\-]*://")
"""Where a URL starts: the text from one to the next is that URL's (in a node list too). A
scheme starts the text or follows a space, a quote, a bracket or a separator, never a
letter, ``:`` or ``/``: in ``redis://kv://00@host`` the password is ``//00``."""
_OPTION_NAME = re.compile(r"(?<=[?&#;])(?P<name>[^?&#;=\s'\"]*)=")
"""An option's ``name=``, in the query or (malformed) the fragment."""
_VALUE_END = re.compile(r"[&;\s'\",\]]|$")
"""Where a secret option's value ends: not at ``?``, ``#`` or ``@``, which may be in it."""
_DIGITS = re.compile(r"[0-9]+")
"""A database number as redis-py reads it (``str.isdigit`` would take ``"²"``)."""


def redact(text: str) -> str:
    """``text`` (a URL, a node list, a message quoting either) with every password shown as
    ``***``: the user part after its first ``:`` (up to the last ``@`` of its URL, whatever
    lies between) and the value of every option named like a secret (password, pass, pwd,
    token, secret, auth; any case); safe on malformed URLs, so error messages can print it.
    Where the two overlap, more is hidden, never less.

    >>> redact("unix://:pw@/run/redis.sock?db=1"), redact("redis://cache:6379/0")
    ('unix://:***@/run/redis.sock?db=1', 'redis://cache:6379/0')
    >>> redact("['redis://:a#b@h:1', 'redis://h:2/0?PassWord=c?d']")
    "['redis://:***@h:1', 'redis://h:2/0?PassWord=***']"
    """
    out, shown = [], 0
    for start, end in _merged([*_login_spans(text), *_option_spans(text)]):
        out += [text[shown:start], "***"]
        shown = end
    return "".join(out) + text[shown:]


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` in order, those that overlap or touch made one."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _login_spans(text: str) -> list[tuple[int, int]]:
    """The password of each URL's user part: after its first ``:``, to the URL's last
    ``@`` (a URL runs to the next one's scheme; text with no scheme is one URL)."""
    schemes = list(_SCHEME.finditer(text))
    starts = [0, *(m.end() for m in schemes)]  # the text before the first URL, then each
    ends = [*(m.start() for m in schemes), len(text)]
    spans = []
    for start, end in zip(starts, ends, strict=True):
        at = text.rfind("@", start, end)
        colon = text.find(":", start, at)
        if at >= 0 and colon >= 0:
            spans.append((colon + 1, at))
    return spans


def _option_spans(text: str) -> list[tuple[int, int]]:
    """The value of every option named like a secret."""
    spans = []
    for m in _OPTION_NAME.finditer(text):
        if _secret_name(m.group("name")):
            end = _VALUE_END.search(text, m.end())
            spans.append((m.end(), end.start() if end else len(text)))
    return spans


def _secret_name(name: str) -> bool:
    """Whether an option called ``name`` holds a secret (``PASSWORD``, ``pass%77ord``...)."""
    plain = unquote_plus(name).lower()
    return any(word in plain for word in _SECRET_WORDS)


def secrets_of(urls: Sequence[str], password: str | None) -> tuple[str, ...]:
    """Every secret a tier given ``urls`` and ``password`` sends a server: the password
    apart, each URL's user-part password and secret options, as written and decoded. What
    a server says back may quote them (``hide``)."""
    found = {password} if password else set()
    for url in urls:
        for start, end in _merged([*_login_spans(url), *_option_spans(url)]):
            found |= {url[start:end], unquote(url[start:end])}
    return tuple(sorted((s for s in found if s), key=len, reverse=True))


def hide(text: str, secrets: Sequence[str]) -> str:
    """``text`` (what a server said, a message quoting it) with each of ``secrets`` shown as
    ``***``, and any URL in it redacted.

    >>> hide("ERR AUTH default Hunter2 refused", ("Hunter2",))
    'ERR AUTH default *** refused'
    """
    for secret in secrets:
        text = text.replace(secret, "***")
    return redact(text)


def check_url(url: object, where: str, *, username: bool = False, password: bool = False) -> str:
    """``url`` if redis-py will connect where it says; ``ValueError`` naming the part at
    fault otherwise (the URL shown redacted). ``username`` / ``password``: whether they are
    also given outside the URL, which the URL then must not repeat."""
    if not isinstance(url, str):
        raise ValueError(f"{where}: must look like {_SHAPE}, got a {type(url).__name__}")

    def bad(what: str) -> ValueError:
        return ValueError(f"{where}: {what}, got {redact(url)!r}")

    _check_login(url, bad)
    try:
        parts = urlsplit(url)
    except ValueError as e:  # an unclosed [ of an IPv6 address
        raise bad(f"not a URL ({e})") from None
    try:
        port = parts.port
    except ValueError:
        raise bad("port must be an integer in 1..65535") from None
    if parts.scheme not in _SCHEMES or not url.startswith(f"{parts.scheme}://"):
        raise bad(f"must look like {_SHAPE}")
    if "#" in url:
        raise bad("'#' starts a fragment, which redis-py drops: write it as %23")
    options = _query(parts.query, parts.scheme, bad)
    if parts.scheme == "unix":
        if parts.hostname or not parts.path.strip("/"):
            raise bad("give the socket's path after three slashes: unix:///path/to/redis.sock")
    else:
        _check_address(parts.hostname, port, parts.path, "db" in options, bad)
    if parts.password is not None and "password" in options:
        raise bad("the password is given twice (in the user part and ?password=): keep one")
    if password and (parts.password is not None or "password" in options):
        raise bad("the password is given twice (in the URL and apart): keep one")
    if username and (parts.username or "username" in options):
        raise bad("the username is given twice (in the URL and apart): keep one")
    return url


def _check_login(url: str, bad: _Fault) -> None:
    """A login (``user:password@``) that a ``/``, ``?`` or ``#`` would cut short: URL
    parsers end it there, and the rest of the password would be read as a path, query or
    fragment."""
    start = url.find("://") + 3 if "://" in url else 0
    at = url.rfind("@")
    if at > start and any(c in url[start:at] for c in "/?#"):
        raise bad("the login (before '@') holds '/', '?' or '#', which URL parsers end it "
                  "at: percent-encode them in a password (%2F, %3F, %23), and an '@' "
                  "elsewhere (%40)")


def check_cluster_nodes(
    nodes: object, where: str, *, username: bool = False, password: bool = False
) -> tuple[str, ...]:
    """A Redis Cluster's start-up nodes as URLs: each ``host:port`` (plain TCP) or a
    ``redis://`` / ``rediss://`` URL checked like ``check_url``, database 0 only (a cluster
    has no other). The nodes share one connection setup, so every URL must carry the same
    scheme, login and options; ``ValueError`` naming the node at fault otherwise.

    >>> check_cluster_nodes(["10.0.0.1:7000", "redis://10.0.0.2:7000"], "nodes")
    ('redis://10.0.0.1:7000', 'redis://10.0.0.2:7000')
    >>> check_cluster_nodes(["10.0.0.1"], "nodes")
    Traceback (most recent call last):
    ...
    ValueError: nodes[0]: give each node as host:port or redis://host:port, got '10.0.0.1'
    """
    if isinstance(nodes, str) or not isinstance(nodes, (list, tuple)) or not nodes:
        raise ValueError(f"{where}: must be a non-empty list of host:port strings, got "
                         f"{redact(str(nodes))!r:.80}")
    urls = tuple(_node_url(node, f"{where}[{i}]", username, password)
                 for i, node in enumerate(nodes))
    shared = {_setup(url) for url in urls}
    if len(shared) > 1:
        raise ValueError(f"{where}: every node must use the same scheme, login and URL "
                         f"options (they share one connection setup); got "
                         f"{[redact(u) for u in urls]}")
    if len({urlsplit(u).netloc for u in urls}) < len(urls):
        raise ValueError(f"{where}: a node is listed twice: {[redact(u) for u in urls]}")
    return urls


def check_cluster_namespace(namespace: str, where: str) -> None:
    """``ValueError`` if ``namespace`` holds a hash tag (``{...}``): the cluster would hash
    only the tag, putting every chunk in one slot of one node.

    >>> check_cluster_namespace("llama{8b}", "ns")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ns: on a cluster the namespace must not hold '{' or '}' ..., got 'llama{8b}'
    """
    if "{" in namespace or "}" in namespace:
        raise ValueError(f"{where}: on a cluster the namespace must not hold '{{' or '}}' (a "
                         f"hash tag would put every chunk on one node), got {namespace!r}")


def _node_url(node: object, where: str, username: bool, password: bool) -> str:
    """One start-up node as a checked URL (``host:port`` becomes ``redis://host:port``)."""
    if not isinstance(node, str):
        raise ValueError(f"{where}: must be a host:port string, got a {type(node).__name__}")
    url = node if "://" in node else f"redis://{node}"
    parts = urlsplit(url) if url.startswith(("redis://", "rediss://")) else None
    try:
        port = parts.port if parts is not None else None
    except ValueError:
        port = None
    if parts is None or port is None:
        raise ValueError(f"{where}: give each node as host:port or redis://host:port, got "
                         f"{redact(node)!r}")
    check_url(url, where, username=username, password=password)
    db = parts.path.strip("/") or dict(parse_qsl(parts.query)).get("db", "0")
    if db != "0":
        raise ValueError(f"{where}: a cluster has database 0 only, got {redact(node)!r}")
    return url


def _setup(url: str) -> tuple[str, str, str]:
    """What the nodes of one cluster must share: scheme, login, options."""
    parts = urlsplit(url)
    login = parts.netloc.rpartition("@")[0]
    return parts.scheme, login, parts.query


def _check_address(
    host: str | None, port: int | None, path: str, db_in_query: bool, bad: _Fault
) -> None:
    if not host:
        raise bad("give the server's host: redis://host:port/db")
    if port == 0:
        raise bad("port must be an integer in 1..65535")
    db = path.strip("/")
    if db and not _DIGITS.fullmatch(db):
        raise bad("the database (the path) must be a number such as /0")
    if db and db_in_query:
        raise bad("the database is given twice (path and ?db=): keep one")


def _query(query: str, scheme: str, bad: _Fault) -> dict[str, str]:
    """The URL's query options, each known to this scheme, given once, with a valid value."""
    known = {**_QUERY, **(_TLS_QUERY if scheme == "rediss" else {})}
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in known:
            tls = " (TLS options need rediss://)" if name in _TLS_QUERY else ""
            case = " (names are lower case)" if name.lower() in known else ""
            raise bad(f"unknown URL option {name!r}{tls}{case}; known: {sorted(known)}")
        choices = known[name]
        if name in options:
            raise bad(f"URL option {name!r} is given twice")
        if choices is not None and value.lower() not in choices:
            raise bad(f"URL option {name!r} must be one of {list(choices)}")
        options[name] = value
    if not _DIGITS.fullmatch(options.get("db", "0")):
        raise bad("URL option 'db' must be a number such as 0")
    return options


def read_password(password_file: str | None, password_env: str | None, where: str) -> str | None:
    """The password in ``password_file`` (its content less a final line break) or in the
    environment variable ``password_env`` (at most one given); None with neither.
    ``ValueError`` naming the file or variable, never its content, if it cannot be read."""
    if password_file is not None and password_env is not None:
        raise ValueError(f"{where}: give password_file or password_env, not both")
    if password_file is not None:
        secret = _read_secret(password_file, f"{where}.password_file")
        source = f"password_file {password_file}"
    elif password_env is not None:
        secret = os.environ.get(password_env, "")
        source = f"environment variable {password_env}"
    else:
        return None
    if not secret:
        raise ValueError(f"{where}: {source} is empty or unset; put the Redis password there")
    return secret


def _read_secret(path: str, where: str) -> str:
    """The UTF-8 text of the password file at ``path`` less a final line break."""
    data = read_secret_file(path, where, "password")
    try:
        return data.decode().rstrip("\r\n")
    except UnicodeDecodeError:
        raise ValueError(f"{where}: cannot read {path} (not UTF-8 text)") from None
