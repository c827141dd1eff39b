"""Proof that the one talking holds a key, now: a signature over a service's fresh nonce, the
service's name and the time, under its own domain tag. Good for one connection to one service:
replayed elsewhere it carries another nonce or audience (README.md, "Proof of holding a key")."""

from __future__ import annotations

import math
from typing import Any

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import open_body, seal_body

CHALLENGE_DOMAIN = b"gossamer-challenge-v1\0"
NONCE_BYTES = 32
MAX_AUDIENCE_CHARS = 256
MAX_ANSWER_BYTES = 1024
_FIELDS = frozenset({"nonce", "audience", "t"})


def answer_challenge(identity: Identity, *, nonce: bytes, audience: str, now: float) -> bytes:
    """Sign ``nonce`` for the service named ``audience`` at time ``now`` (a signed blob)."""
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise ValueError(f"a challenge nonce is {NONCE_BYTES} bytes, got {nonce!r:.80}")
    if not isinstance(audience, str) or not 0 < len(audience) <= MAX_AUDIENCE_CHARS:
        raise ValueError(f"audience must be 1..{MAX_AUDIENCE_CHARS} characters, got {audience!r:.80}")
    if not math.isfinite(now):
        raise ValueError(f"now must be a finite time, got {now!r}")
    return seal_body(identity, {"nonce": nonce, "audience": audience, "t": float(now)}, domain=CHALLENGE_DOMAIN)


def check_answer(blob: bytes, *, nonce: bytes, audience: str, now: float, skew_s: float) -> bytes:
    """The public key that answered ``nonce`` for ``audience`` within ``skew_s`` of ``now``;
    VerificationError (opaque) for anything else: another nonce or audience, a bad signature, a
    stale or future time, a malformed blob."""
    body, public_key = open_body(blob, domain=CHALLENGE_DOMAIN, max_bytes=MAX_ANSWER_BYTES)
    if not _matches(body, nonce=nonce, audience=audience, now=now, skew_s=skew_s):
        raise VerificationError()
    return public_key


def _matches(body: dict[str, Any], *, nonce: bytes, audience: str, now: float, skew_s: float) -> bool:
    t = body.get("t")
    return (body.keys() == _FIELDS and body["nonce"] == nonce and body["audience"] == audience
            and isinstance(t, float) and math.isfinite(t) and abs(now - t) <= skew_s)
