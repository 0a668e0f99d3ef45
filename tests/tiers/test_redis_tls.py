"""The Redis tier over TLS, as docs/tiers.md tells it: ``rediss://`` with redis-py's TLS
options as URL query parameters, against a real ``redis-server`` that wants client
certificates (throwaway certificates made with ``openssl``)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tier_helpers import GEOMETRY, REDIS_SERVER, Clock, RedisServer, free_port, items, key

from kvtier.tiers.config import RedisConfig
from kvtier.tiers.redis.tier import RedisTier

pytestmark = pytest.mark.redis
OPENSSL = shutil.which("openssl")


def openssl(*args: str | Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *map(str, args)], check=True, capture_output=True, timeout=60)


def certificates(where: Path) -> dict[str, Path]:
    """A CA, and a server (for 127.0.0.1) and a client certificate it signed."""
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *new_key, "-keyout", where / "ca.key", "-out", where / "ca.pem",
            "-days", "1", "-subj", "/CN=kvtier test CA")
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        openssl("req", *new_key, "-keyout", where / f"{name}.key", "-out", where / f"{name}.csr",
                "-subj", f"/CN=kvtier test {name}")
        openssl("x509", "-req", "-in", where / f"{name}.csr", "-CA", where / "ca.pem",
                "-CAkey", where / "ca.key", "-CAcreateserial", "-days", "1",
                "-extfile", where / "san.ext", "-out", where / f"{name}.pem")
    return {name: where / name for name in
            ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


TlsUrl = Callable[..., str]
"""Makes the ``rediss://`` URL of the TLS server from query options (paths by file name)."""


@pytest.fixture
def tls_url(tmp_path: Path) -> Iterator[TlsUrl]:
    """A server with a TLS port that wants a client certificate (and a plain port, for the
    readiness check)."""
    if REDIS_SERVER is None or OPENSSL is None:
        pytest.skip("needs redis-server (built with TLS, as Debian's is) and openssl on PATH")
    files = certificates(tmp_path)
    tls_port = free_port()
    server = RedisServer(tmp_path, args=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(files["server.pem"]),
        "--tls-key-file", str(files["server.key"]), "--tls-ca-cert-file", str(files["ca.pem"]),
        "--tls-auth-clients", "yes",
    ])
    server.start()

    def url(**options: str) -> str:
        query = "&".join(f"{k}={files.get(v, v)}" for k, v in options.items())
        return f"rediss://127.0.0.1:{tls_port}/0?{query}"

    yield url
    server.stop()


def test_rediss_with_certificates_as_url_options(tls_url: TlsUrl) -> None:
    url = tls_url(ssl_ca_certs="ca.pem", ssl_certfile="client.pem", ssl_keyfile="client.key",
                  ssl_cert_reqs="required", ssl_check_hostname="true")
    tier = RedisTier(RedisConfig(url=url).url, geometry=GEOMETRY, clock=Clock())
    assert tier.put(items("a")) == [key("a")]
    assert list(tier.get([key("a")])) == [key("a")] and tier.healthy
    tier.close()


def test_an_unverified_server_is_not_trusted(tls_url: TlsUrl) -> None:
    # no CA: the system's, which never signed the server's certificate
    url = tls_url(ssl_certfile="client.pem", ssl_keyfile="client.key")
    tier = RedisTier(url, geometry=GEOMETRY, timeout_s=2.0, clock=Clock())
    assert tier.put(items("a")) == [] and not tier.healthy
    assert tier.last_error is not None and "CERTIFICATE_VERIFY_FAILED" in tier.last_error
    tier.close()
