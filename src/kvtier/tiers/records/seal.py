"""Authenticated and encrypted records, for tiers that others can write to.

A plain record (``kvtier.tiers.records.format``) is protected by crc32 only: it catches torn and
flipped bytes, but anyone who can write the disk directory or the Redis namespace can write
a well-formed record that is served. A *seal* closes that: every process of a deployment
reads one secret (from a file or an environment variable, never from the config itself),
and records carry proof that a holder of the secret wrote them.

* ``MacSeal``: the payload stays in clear, followed by a 32-byte HMAC-SHA256 of the header
  and payload (stdlib only). A writer without the secret cannot forge a chunk.
* ``AeadSeal``: the payload is encrypted with AES-256-GCM (the ``kvtier[crypto]`` extra),
  a fresh random 12-byte nonce per record, the header as associated data. It also hides the
  bytes from whoever can read the medium.

Either way the header (the chunk key, which hashes the namespace, and the layout's
geometry) is covered, so a record moved under another key, or read by another layout, fails
like a forged one: a counted miss. Keys for the two uses are derived from the secret
separately (HMAC-SHA256 of a purpose label), so one secret serves both.

>>> secret = Secret(b"0123456789abcdef0123456789abcdef", "doctest")
>>> secret
Secret(from doctest, redacted)
>>> seal = MacSeal(secret)
>>> body = seal.seal(b"header", memoryview(b"payload"))
>>> bytes(seal.open(b"header", memoryview(b"".join(bytes(b) for b in body))))
b'payload'
"""

from __future__ import annotations

import hmac
import os
import stat
from abc import ABC, abstractmethod
from typing import Any

from kvtier.store.backend import BytesLike
from kvtier.tiers.records.errors import RecordError

MIN_SECRET_BYTES = 16
"""A shorter secret is refused: it could be guessed."""


class SealError(RecordError):
    """A sealed record failed authentication (forged, tampered, or another secret)."""


MAX_SECRET_FILE_BYTES = 4096
"""The most a secret or password file may hold."""


def read_secret_file(path: str, where: str, what: str) -> bytes:
    """The bytes of the regular file at ``path``, at most ``MAX_SECRET_FILE_BYTES`` (a FIFO
    would block, a device never end). ``ValueError`` naming ``where`` and the file, never
    its content."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError("not a regular file")
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_FILE_BYTES + 1)
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise ValueError(f"{where}: cannot read {path} ({reason})") from None
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise ValueError(f"{where}: {path} is longer than {MAX_SECRET_FILE_BYTES} bytes: "
                         f"not a {what} file")
    return data


class Secret:
    """Key material; its value is never printed (``repr`` says only where it came from)."""

    __slots__ = ("_value", "source")

    def __init__(self, value: bytes, source: str) -> None:
        if len(value) < MIN_SECRET_BYTES:
            raise ValueError(
                f"{source}: the secret is {len(value)} bytes; give at least "
                f"{MIN_SECRET_BYTES} (e.g. the output of `openssl rand -hex 32`)"
            )
        self._value, self.source = value, source

    def __repr__(self) -> str:
        return f"Secret(from {self.source}, redacted)"

    @classmethod
    def load(cls, *, file: str | None = None, env: str | None = None) -> Secret:
        """The secret in ``file`` (its bytes, surrounding whitespace removed) or in the
        environment variable ``env``; ValueError naming the source, never the value."""
        if (file is None) == (env is None):
            raise ValueError("a secret comes from exactly one of a file or an environment "
                             "variable")
        if file is not None:
            value = read_secret_file(file, f"secret file {file}", "secret").strip()
            return cls(value, f"file {file}")
        assert env is not None
        found = os.environ.get(env)
        if not found:
            raise ValueError(f"environment variable {env} holds no secret (unset or empty)")
        return cls(found.strip().encode(), f"environment variable {env}")

    def derive(self, purpose: str) -> bytes:
        """A 32-byte key for one ``purpose``, independent of the keys for others."""
        return hmac.digest(self._value, f"kvtier record {purpose}".encode(), "sha256")


class Seal(ABC):
    """How a record's payload is protected; ``ident`` is written in the record header."""

    ident: int
    """The record header's seal field (0 is a plain record)."""
    name: str
    overhead: int
    """Bytes a sealed body adds to the payload."""

    @abstractmethod
    def seal(self, header: bytes, payload: memoryview) -> list[BytesLike]:
        """The record's body (after ``header``) as buffers to write in order."""

    @abstractmethod
    def open(self, header: bytes, body: memoryview) -> memoryview:
        """The payload of ``body`` if it authenticates under ``header``; SealError if not."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(redacted)"


class MacSeal(Seal):
    """Payload in clear, then HMAC-SHA256(header || payload) (module docstring)."""

    ident, name, overhead = 1, "mac", 32

    def __init__(self, secret: Secret) -> None:
        self._key = secret.derive("mac")

    def _tag(self, header: bytes, payload: memoryview) -> bytes:
        mac = hmac.new(self._key, header, "sha256")
        mac.update(payload)
        return mac.digest()

    def seal(self, header: bytes, payload: memoryview) -> list[BytesLike]:
        return [payload, self._tag(header, payload)]

    def open(self, header: bytes, body: memoryview) -> memoryview:
        if body.nbytes < self.overhead:
            raise SealError("sealed record too short for its MAC")
        payload, tag = body[: -self.overhead], body[-self.overhead :]
        if not hmac.compare_digest(self._tag(header, payload), tag):
            raise SealError("record MAC mismatch (forged, tampered, or another secret)")
        return payload


class AeadSeal(Seal):
    """AES-256-GCM: nonce (12 bytes), then ciphertext and tag (module docstring)."""

    ident, name, overhead = 2, "aead", 12 + 16

    def __init__(self, secret: Secret) -> None:
        self._aead = _aesgcm()(secret.derive("aead"))

    def seal(self, header: bytes, payload: memoryview) -> list[BytesLike]:
        nonce = os.urandom(12)
        return [nonce, self._aead.encrypt(nonce, payload, header)]

    def open(self, header: bytes, body: memoryview) -> memoryview:
        from cryptography.exceptions import InvalidTag

        if body.nbytes < self.overhead:
            raise SealError("sealed record too short for its nonce and tag")
        try:
            plain = self._aead.decrypt(body[:12], body[12:], header)
        except InvalidTag:
            raise SealError(
                "record failed decryption (forged, tampered, or another secret)"
            ) from None
        return memoryview(plain)


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ValueError(
            "encrypted records need the cryptography package: pip install 'kvtier[crypto]'"
        ) from None
    return AESGCM


def seal_for(
    secret_file: str | None, secret_env: str | None, encrypt: bool
) -> Seal | None:
    """The seal a tier's config asks for: none without a secret, AES-GCM with
    ``encrypt``, else HMAC. Reads the secret (ValueError naming its source)."""
    if secret_file is None and secret_env is None:
        return None
    secret = Secret.load(file=secret_file, env=secret_env)
    return AeadSeal(secret) if encrypt else MacSeal(secret)

