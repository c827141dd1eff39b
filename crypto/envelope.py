"""Signed envelopes for data-plane messages (sender, recipient, run, round, method and target, time,
nonce, payload digest) and ``ReplayGuard``, which checks one before its payload is read and
remembers its nonce only once the payload matched; bounded memory that fails closed
(README.md, "Signed envelopes and the replay guard")."""

from __future__ import annotations

import hashlib
import heapq
import hmac
import math
import re
from dataclasses import dataclass
from typing import Any

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity, peer_id_of
from gossamer.crypto.signed import decode_body, seal_body, unwrap

ENVELOPE_DOMAIN = b"gossamer-envelope-v2\0"
NONCE_BYTES = 16
DIGEST_BYTES = 32
MAX_ENVELOPE_BYTES = 4096
MAX_TARGET_CHARS = 2048
_METHOD = re.compile(r"[A-Z]{1,16}")
_FIELDS = frozenset({"sender", "recipient", "run", "round", "method", "target", "ts", "nonce", "digest"})


@dataclass(frozen=True)
class Envelope:
    """The verified metadata of one data-plane message."""

    sender: str
    sender_public_key: bytes
    recipient: str
    run_id: str
    round: int
    method: str
    target: str
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
    method: str,
    target: str,
    payload_digest: bytes,
    now: float,
    nonce: bytes,
) -> bytes:
    """Sign an envelope for ``recipient`` and the request ``method target`` (an upper-case HTTP
    method; the request target as sent, path and query); ``now`` and ``nonce`` (16 random bytes)
    come from the caller."""
    _require(isinstance(recipient, str) and recipient != "", "recipient must be a non-empty str")
    _require(isinstance(run_id, str) and run_id != "", "run_id must be a non-empty str")
    _require(
        isinstance(round, int) and not isinstance(round, bool) and round >= 0, "round must be an int >= 0"
    )
    _require(_is_method(method), "method must be 1-16 upper-case letters")
    _require(_is_target(target), f"target must be a str starting with '/', at most {MAX_TARGET_CHARS} chars")
    _require(_is_bytes(payload_digest, DIGEST_BYTES), f"payload_digest must be {DIGEST_BYTES} bytes")
    _require(_is_bytes(nonce, NONCE_BYTES), f"nonce must be {NONCE_BYTES} bytes")
    _require(isinstance(now, int | float) and math.isfinite(now), "now must be a finite number of seconds")
    body = {
        "sender": identity.peer_id,
        "recipient": recipient,
        "run": run_id,
        "round": round,
        "method": method,
        "target": target,
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
    """Opens envelopes addressed to this peer and refuses replays; time is always a parameter.

    ``started_at`` (the receiver's clock when the guard, i.e. the process, started) is the
    guard's first floor: an envelope stamped before it is refused. The nonces a previous process
    remembered are gone after a restart; this floor keeps them refused, because every envelope
    that process admitted was stamped before the restart (up to the sender's clock lead, see
    SECURITY.md). Without it (tests of the window alone) the floor starts at minus infinity."""

    def __init__(self, config: ReplayGuardConfig | None = None, *, started_at: float | None = None) -> None:
        if started_at is not None and not (isinstance(started_at, int | float) and math.isfinite(started_at)):
            raise ValueError(f"started_at must be a finite number of seconds, got {started_at!r}")
        self._config = config or ReplayGuardConfig()
        self._seen: dict[bytes, float] = {}  # sender public key + nonce -> envelope timestamp
        self._expiry: list[tuple[float, bytes]] = []  # min-heap over the same entries
        self._held: set[bytes] = set()  # nonces of messages whose payload is still being received
        self._floor_s = -math.inf if started_at is None else float(started_at)

    def __len__(self) -> int:
        """Number of nonces remembered now."""
        return len(self._seen)

    def check(
        self,
        blob: bytes,
        *,
        me: str,
        run_id: str,
        method: str,
        target: str,
        now: float,
        expected_public_key: bytes | None = None,
    ) -> Envelope:
        """Everything but the payload, before a payload byte is read: VerificationError unless
        ``blob`` is a well-signed, fresh envelope for (me, run_id, method, target) whose nonce is
        neither remembered nor held by a message still being received. On success the nonce is
        held (a duplicate is refused) until ``admit`` remembers it or ``release`` lets it go."""
        if not (isinstance(now, int | float) and math.isfinite(now)):
            raise ValueError(f"now must be a finite number of seconds, got {now!r}")
        signed = unwrap(blob, max_bytes=MAX_ENVELOPE_BYTES)
        if expected_public_key is not None and signed.public_key != expected_public_key:
            raise VerificationError()
        envelope = _parse(decode_body(signed, max_bytes=MAX_ENVELOPE_BYTES), signed.public_key)
        key = envelope.sender_public_key + envelope.nonce
        ok = (
            envelope.sender == peer_id_of(envelope.sender_public_key)
            and envelope.recipient == me
            and envelope.run_id == run_id
            and envelope.method == method
            and envelope.target == target
            and abs(envelope.timestamp - now) <= self._config.window_s
            and envelope.timestamp >= self._floor_s
            and key not in self._seen
            and key not in self._held
        )
        if not ok:
            raise VerificationError()
        signed.verify(ENVELOPE_DOMAIN)  # the costly check last, and before anything is held
        self._prune(now - self._config.window_s)
        if len(self._seen) + len(self._held) >= self._config.max_entries:
            raise VerificationError()  # fail closed until entries age out
        self._held.add(key)
        return envelope

    def admit(self, envelope: Envelope, *, payload_digest: bytes, now: float) -> None:
        """After the payload of a ``check``-ed envelope: VerificationError unless its digest is
        the one the envelope signed; then the nonce is remembered. The payload may have taken
        longer than ``window_s`` to arrive: the nonce was held all along, so no duplicate got in."""
        key = envelope.sender_public_key + envelope.nonce
        if key not in self._held:
            raise VerificationError()  # never checked, or already admitted / released
        if not (isinstance(payload_digest, bytes) and hmac.compare_digest(envelope.payload_digest, payload_digest)):
            raise VerificationError()
        self._held.discard(key)
        self._prune(now - self._config.window_s)
        self._seen[key] = envelope.timestamp
        heapq.heappush(self._expiry, (envelope.timestamp, key))

    def release(self, envelope: Envelope) -> None:
        """Let go of a nonce ``check`` held whose payload never matched (cut, refused, wrong
        digest); a no-op once ``admit`` remembered it. Call it in a ``finally``."""
        self._held.discard(envelope.sender_public_key + envelope.nonce)

    def open(
        self,
        blob: bytes,
        *,
        me: str,
        run_id: str,
        method: str,
        target: str,
        payload_digest: bytes,
        now: float,
        expected_public_key: bytes | None = None,
    ) -> Envelope:
        """``check`` then ``admit``, for a payload already at hand."""
        envelope = self.check(blob, me=me, run_id=run_id, method=method, target=target, now=now,
                              expected_public_key=expected_public_key)
        try:
            self.admit(envelope, payload_digest=payload_digest, now=now)
        finally:
            self.release(envelope)
        return envelope

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
    sender, recipient, run, rnd, method, target, ts = (
        body["sender"],
        body["recipient"],
        body["run"],
        body["round"],
        body["method"],
        body["target"],
        body["ts"],
    )
    ok = (
        isinstance(sender, str)
        and isinstance(recipient, str)
        and isinstance(run, str)
        and isinstance(rnd, int)
        and not isinstance(rnd, bool)
        and rnd >= 0
        and _is_method(method)
        and _is_target(target)
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
        method=method,
        target=target,
        timestamp=ts,
        nonce=body["nonce"],
        payload_digest=body["digest"],
    )


def _is_method(value: Any) -> bool:
    return isinstance(value, str) and _METHOD.fullmatch(value) is not None


def _is_target(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("/") and len(value) <= MAX_TARGET_CHARS


def _is_bytes(value: Any, length: int) -> bool:
    return isinstance(value, bytes) and len(value) == length


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
