"""Signed envelopes for data-plane messages, and the replay guard that opens them.

An envelope binds one message to its sender, recipient, run, round, send time, a 16-byte nonce and
the SHA-256 digest of the payload bytes; the sender signs it with its Ed25519 identity under an
envelope-only domain tag. ``ReplayGuard.open`` refuses, with the same opaque ``VerificationError``
every time: a malformed blob, a bad signature, a sender id that is not the fingerprint of the
signing key, another recipient, another run, another payload, a timestamp outside
``now +- window_s``, and a nonce already seen from that sender.

Nonce memory is bounded. An entry is forgotten once its timestamp falls below the guard's floor
(the highest ``now - window_s`` seen so far); envelopes older than the floor are refused, so
forgetting never re-opens a replay, even when a caller's clock steps back. If the memory is
still full after pruning, the guard fails closed: it refuses new envelopes until entries age out.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import math
from dataclasses import dataclass
from typing import Any

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity, peer_id_of
from gossamer.crypto.signed import decode_body, seal_body, unwrap

ENVELOPE_DOMAIN = b"gossamer-envelope-v1\0"
NONCE_BYTES = 16
DIGEST_BYTES = 32
MAX_ENVELOPE_BYTES = 4096
_FIELDS = frozenset({"sender", "recipient", "run", "round", "ts", "nonce", "digest"})


@dataclass(frozen=True)
class Envelope:
    """The verified metadata of one data-plane message."""

    sender: str
    sender_public_key: bytes
    recipient: str
    run_id: str
    round: int
    timestamp: float
    nonce: bytes
    payload_digest: bytes


def payload_digest(*buffers: bytes | bytearray | memoryview) -> bytes:
    """SHA-256 over the concatenation of ``buffers``, fed one by one (no joined copy)."""
    digest = hashlib.sha256()
    for buffer in buffers:
        digest.update(buffer)
    return digest.digest()


def seal(
    identity: Identity,
    *,
    recipient: str,
    run_id: str,
    round: int,
    payload_digest: bytes,
    now: float,
    nonce: bytes,
) -> bytes:
    """Sign an envelope for ``recipient``; ``now`` and ``nonce`` (16 random bytes) come from the caller."""
    _require(isinstance(recipient, str) and recipient != "", "recipient must be a non-empty str")
    _require(isinstance(run_id, str) and run_id != "", "run_id must be a non-empty str")
    _require(
        isinstance(round, int) and not isinstance(round, bool) and round >= 0, "round must be an int >= 0"
    )
    _require(_is_bytes(payload_digest, DIGEST_BYTES), f"payload_digest must be {DIGEST_BYTES} bytes")
    _require(_is_bytes(nonce, NONCE_BYTES), f"nonce must be {NONCE_BYTES} bytes")
    _require(isinstance(now, int | float) and math.isfinite(now), "now must be a finite number of seconds")
    body = {
        "sender": identity.peer_id,
        "recipient": recipient,
        "run": run_id,
        "round": round,
        "ts": float(now),
        "nonce": nonce,
        "digest": payload_digest,
    }
    return seal_body(identity, body, domain=ENVELOPE_DOMAIN)


@dataclass(frozen=True, kw_only=True)
class ReplayGuardConfig:
    """How long envelopes stay valid and how many nonces the guard remembers."""

    window_s: float = 60.0
    """An envelope is accepted while its timestamp is within ``now +- window_s``."""
    max_entries: int = 1_000_000
    """Most nonces remembered at once; when full (after pruning) new envelopes are refused."""

    def __post_init__(self) -> None:
        if not (
            isinstance(self.window_s, int | float) and math.isfinite(self.window_s) and self.window_s > 0
        ):
            raise ValueError(f"window_s must be a finite number > 0, got {self.window_s!r}")
        if not (isinstance(self.max_entries, int) and self.max_entries >= 1):
            raise ValueError(f"max_entries must be an int >= 1, got {self.max_entries!r}")


class ReplayGuard:
    """Opens envelopes addressed to this peer and refuses replays; time is always a parameter."""

    def __init__(self, config: ReplayGuardConfig | None = None) -> None:
        self._config = config or ReplayGuardConfig()
        self._seen: dict[bytes, float] = {}  # sender public key + nonce -> envelope timestamp
        self._expiry: list[tuple[float, bytes]] = []  # min-heap over the same entries
        self._floor_s = -math.inf

    def __len__(self) -> int:
        """Number of nonces remembered now."""
        return len(self._seen)

    def open(
        self,
        blob: bytes,
        *,
        me: str,
        run_id: str,
        payload_digest: bytes,
        now: float,
        expected_public_key: bytes | None = None,
    ) -> Envelope:
        """Verify ``blob`` for (me, run_id, payload_digest) at time ``now``; VerificationError otherwise."""
        if not (isinstance(now, int | float) and math.isfinite(now)):
            raise ValueError(f"now must be a finite number of seconds, got {now!r}")
        signed = unwrap(blob, max_bytes=MAX_ENVELOPE_BYTES)
        if expected_public_key is not None and signed.public_key != expected_public_key:
            raise VerificationError()
        envelope = _parse(decode_body(signed, max_bytes=MAX_ENVELOPE_BYTES), signed.public_key)
        self._check_binding(envelope, me=me, run_id=run_id, payload_digest=payload_digest, now=now)
        signed.verify(ENVELOPE_DOMAIN)  # the costly check last, and before anything is remembered
        self._remember(envelope, now)
        return envelope

    def _check_binding(
        self, envelope: Envelope, *, me: str, run_id: str, payload_digest: bytes, now: float
    ) -> None:
        """Everything that needs no signature: identity binding, addressing, payload, freshness."""
        ok = (
            envelope.sender == peer_id_of(envelope.sender_public_key)
            and envelope.recipient == me
            and envelope.run_id == run_id
            and isinstance(payload_digest, bytes)
            and hmac.compare_digest(envelope.payload_digest, payload_digest)
            and abs(envelope.timestamp - now) <= self._config.window_s
            and envelope.timestamp >= self._floor_s
        )
        if not ok:
            raise VerificationError()

    def _remember(self, envelope: Envelope, now: float) -> None:
        """Record the nonce, refusing it if already seen; prune first, fail closed when full."""
        self._prune(now - self._config.window_s)
        key = envelope.sender_public_key + envelope.nonce
        if key in self._seen or len(self._seen) >= self._config.max_entries:
            raise VerificationError()
        self._seen[key] = envelope.timestamp
        heapq.heappush(self._expiry, (envelope.timestamp, key))

    def _prune(self, cutoff_s: float) -> None:
        """Forget nonces with timestamps below ``cutoff_s``; such envelopes are refused from now on."""
        self._floor_s = max(self._floor_s, cutoff_s)
        while self._expiry and self._expiry[0][0] < self._floor_s:
            _, key = heapq.heappop(self._expiry)
            del self._seen[key]


def _parse(body: dict[str, Any], public_key: bytes) -> Envelope:
    """Check the body's field names, types and lengths and build the Envelope."""
    if body.keys() != _FIELDS:
        raise VerificationError()
    sender, recipient, run, rnd, ts = (
        body["sender"],
        body["recipient"],
        body["run"],
        body["round"],
        body["ts"],
    )
    ok = (
        isinstance(sender, str)
        and isinstance(recipient, str)
        and isinstance(run, str)
        and isinstance(rnd, int)
        and not isinstance(rnd, bool)
        and rnd >= 0
        and isinstance(ts, float)
        and math.isfinite(ts)
        and _is_bytes(body["nonce"], NONCE_BYTES)
        and _is_bytes(body["digest"], DIGEST_BYTES)
    )
    if not ok:
        raise VerificationError()
    return Envelope(
        sender=sender,
        sender_public_key=public_key,
        recipient=recipient,
        run_id=run,
        round=rnd,
        timestamp=ts,
        nonce=body["nonce"],
        payload_digest=body["digest"],
    )


def _is_bytes(value: Any, length: int) -> bool:
    return isinstance(value, bytes) and len(value) == length


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
