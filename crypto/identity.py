"""A peer's Ed25519 identity in an owner-only (0600) PKCS8 PEM file; its peer id is the hex SHA-256 of
the raw public key. ``load`` refuses a file others can read or write; ``create`` never overwrites;
``verify_signature`` is the one place a signature is checked (it raises, never returns a bool)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gossamer.crypto.errors import IdentityError, VerificationError

PUBLIC_KEY_BYTES = 32
PRIVATE_KEY_BYTES = 32
SIGNATURE_BYTES = 64
MAX_IDENTITY_FILE_BYTES = 4096
"""A PKCS8 PEM Ed25519 key is ~120 bytes; anything much larger is not one of ours."""


def peer_id_of(public_key: bytes) -> str:
    """Return the peer id (64 hex chars) of a 32-byte raw Ed25519 public key."""
    if not isinstance(public_key, bytes) or len(public_key) != PUBLIC_KEY_BYTES:
        raise ValueError(f"public_key must be {PUBLIC_KEY_BYTES} raw bytes")
    return hashlib.sha256(public_key).hexdigest()


def verify_signature(public_key: bytes, signature: bytes, data: bytes) -> None:
    """Check an Ed25519 signature; raise VerificationError on any failure (never returns a bool)."""
    if not isinstance(public_key, bytes) or len(public_key) != PUBLIC_KEY_BYTES:
        raise VerificationError()
    if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
        raise VerificationError()
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, data)
    except (InvalidSignature, ValueError, TypeError) as exc:
        raise VerificationError() from exc


class Identity:
    """An Ed25519 key pair: signs for one peer. Build with ``generate``, ``load`` or ``create``."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private_key = private_key
        self._public_key = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self._peer_id = peer_id_of(self._public_key)

    @classmethod
    def generate(cls) -> Identity:
        """A fresh random identity (not written anywhere)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw32: bytes) -> Identity:
        """An identity from its 32-byte raw private key (the RFC 8032 secret key)."""
        if not isinstance(raw32, bytes) or len(raw32) != PRIVATE_KEY_BYTES:
            raise IdentityError(f"a raw Ed25519 private key is {PRIVATE_KEY_BYTES} bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(raw32))

    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> Identity:
        """Generate an identity and write it to a new 0600 file; refuse to overwrite one."""
        path = Path(path)
        identity = cls.generate()
        try:
            identity._write_new(path)
        except FileExistsError as exc:
            raise IdentityError(f"identity file {path} already exists; refusing to overwrite it") from exc
        return identity

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Read an identity file; IdentityError if missing, malformed or readable by others."""
        path = Path(path)
        pem = _read_private_file(path)
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise IdentityError(f"identity file {path} is not an unencrypted PKCS8 PEM key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise IdentityError(f"identity file {path} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> tuple[Identity, bool]:
        """Load the identity at ``path``, creating it first if absent; returns (identity, created)."""
        path = Path(path)
        if not path.exists():
            identity = cls.generate()
            try:
                identity._write_new(path)
                return identity, True
            except FileExistsError:
                pass  # another process created it between our check and our write: use theirs
        return cls.load(path), False

    @property
    def public_key(self) -> bytes:
        """The 32 raw public key bytes."""
        return self._public_key

    @property
    def peer_id(self) -> str:
        """Hex SHA-256 fingerprint of the public key."""
        return self._peer_id

    def sign(self, data: bytes) -> bytes:
        """A 64-byte Ed25519 signature over ``data``."""
        return self._private_key.sign(data)

    def private_bytes(self) -> bytes:
        """The 32 raw private key bytes (the RFC 8032 secret key). Handle with care."""
        return self._private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def __repr__(self) -> str:
        return f"Identity(peer_id={self._peer_id[:16]}...)"

    def _write_new(self, path: Path) -> None:
        """Write the PEM to a file that must not exist yet (0600, parent 0700); FileExistsError if it does."""
        pem = self._private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(pem)
                file.flush()
                os.fsync(file.fileno())
        except BaseException:
            path.unlink(missing_ok=True)  # never leave a half-written key behind
            raise


def _read_private_file(path: Path) -> bytes:
    """Read a small regular file that only its owner may access; IdentityError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError as exc:
        raise IdentityError(f"identity file {path} does not exist") from exc
    except OSError as exc:
        raise IdentityError(f"cannot open identity file {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())  # the file we opened, not whatever the path points to now
        if not stat.S_ISREG(info.st_mode):
            raise IdentityError(f"identity file {path} is not a regular file")
        if info.st_mode & 0o077:
            raise IdentityError(
                f"identity file {path} is accessible by group or others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); fix it with: chmod 600 {path}"
            )
        data = file.read(MAX_IDENTITY_FILE_BYTES + 1)
    if len(data) > MAX_IDENTITY_FILE_BYTES:
        raise IdentityError(f"identity file {path} is larger than {MAX_IDENTITY_FILE_BYTES} bytes")
    return data
