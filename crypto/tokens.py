"""Owner-signed join tokens: how a run with an ``allowlist`` admission policy lets a peer in. A token
names the run, an expiry, a nonce and optionally the one key it admits; it is a bearer credential
until it expires (README.md, "Join tokens")."""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass
from typing import Any

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import PUBLIC_KEY_BYTES, Identity
from gossamer.crypto.signed import open_body, seal_body

TOKEN_DOMAIN = b"gossamer-join-token-v1\0"
MAX_TOKEN_CHARS = 4096
MIN_NONCE_BYTES = 16
MAX_NONCE_BYTES = 64
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")
_FIELDS = frozenset({"run", "exp", "peer", "nonce"})


@dataclass(frozen=True)
class JoinToken:
    """The verified contents of a join token."""

    run_id: str
    expires_at: float
    peer_public_key: bytes | None
    nonce: bytes
    owner_public_key: bytes


def issue_join_token(
    owner: Identity,
    *,
    run_id: str,
    expires_at: float,
    peer_public_key: bytes | None = None,
    nonce: bytes,
) -> str:
    """Sign a token admitting one peer key (or, if None, whoever holds the token) to ``run_id``."""
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("run_id must be a non-empty str")
    if not isinstance(expires_at, int | float) or not math.isfinite(expires_at):
        raise ValueError(f"expires_at must be a finite number of seconds, got {expires_at!r}")
    if peer_public_key is not None and not _is_public_key(peer_public_key):
        raise ValueError(f"peer_public_key must be None or {PUBLIC_KEY_BYTES} raw bytes")
    if not isinstance(nonce, bytes) or not MIN_NONCE_BYTES <= len(nonce) <= MAX_NONCE_BYTES:
        raise ValueError(f"nonce must be {MIN_NONCE_BYTES}..{MAX_NONCE_BYTES} random bytes")
    body = {"run": run_id, "exp": float(expires_at), "peer": peer_public_key, "nonce": nonce}
    blob = seal_body(owner, body, domain=TOKEN_DOMAIN)
    token = base64.urlsafe_b64encode(blob).rstrip(b"=").decode("ascii")
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(
            f"token would be {len(token)} chars, over MAX_TOKEN_CHARS={MAX_TOKEN_CHARS}; shorten run_id"
        )
    return token


def verify_join_token(
    token: str, *, owner_public_key: bytes, run_id: str, now: float, peer_public_key: bytes
) -> JoinToken:
    """Check a token for (owner, run, peer) at time ``now``; VerificationError on any failure."""
    blob = _decode_text(token)
    body, owner = open_body(
        blob, domain=TOKEN_DOMAIN, max_bytes=MAX_TOKEN_CHARS, expected_public_key=owner_public_key
    )
    parsed = _parse(body, owner)
    ok = (
        parsed.run_id == run_id
        and now < parsed.expires_at
        and (parsed.peer_public_key is None or parsed.peer_public_key == peer_public_key)
    )
    if not ok:
        raise VerificationError()
    return parsed


def _decode_text(token: str) -> bytes:
    """URL-safe base64 without padding -> bytes; only the canonical encoding of a blob is accepted."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not _ALPHABET.fullmatch(token):
        raise VerificationError()
    try:
        blob = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError) as exc:
        raise VerificationError() from exc
    if base64.urlsafe_b64encode(blob).rstrip(b"=").decode("ascii") != token:
        raise VerificationError()  # non-zero trailing bits: another text for the same bytes
    return blob


def _parse(body: dict[str, Any], owner_public_key: bytes) -> JoinToken:
    """Check the body's field names and types and build the JoinToken."""
    run, exp, peer, nonce = body.get("run"), body.get("exp"), body.get("peer"), body.get("nonce")
    ok = (
        body.keys() == _FIELDS
        and isinstance(run, str)
        and isinstance(exp, float)
        and math.isfinite(exp)
        and (peer is None or _is_public_key(peer))
        and isinstance(nonce, bytes)
        and MIN_NONCE_BYTES <= len(nonce) <= MAX_NONCE_BYTES
    )
    if not ok:
        raise VerificationError()
    return JoinToken(
        run_id=run, expires_at=exp, peer_public_key=peer, nonce=nonce, owner_public_key=owner_public_key
    )


def _is_public_key(value: Any) -> bool:
    return isinstance(value, bytes) and len(value) == PUBLIC_KEY_BYTES
