"""Signed DHT entries, the only values gossamer's DHT nodes store or believe: each names the key it
was written for, its payload (``b""``: a withdrawal tombstone) and its signing and expiry times,
and lives under its signer's peer id (README.md, "Signed entries")."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity, peer_id_of
from gossamer.crypto.signed import SignedBlob, decode_body, seal_body, unwrap
from gossamer.transport.errors import DecodeError

ENTRY_DOMAIN = b"gossamer-dht-entry-v1\0"
ENTRY_OVERHEAD_BYTES = 1024
"""What an entry adds to its payload (key, times, public key, signature, framing), at most."""
_PEER_ID = re.compile(r"[0-9a-f]{64}")
_FIELDS = frozenset({"key", "payload", "signed_at", "expires_at"})


class EntryRefused(DecodeError):
    """A DHT value that is not a valid signed entry for where it was found. ``reason`` is a short
    category for counters (``malformed``, ``signature``, ``subkey``, ``key``, ``expiration``,
    ``lifetime``, ``future``, ``size``, ``not-dictionary`` or a key rule's own); the message says more."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Entry:
    """A verified entry: ``subkey`` is the peer id of the key that signed it."""

    key: str
    subkey: str
    payload: bytes
    signed_at: float
    expires_at: float

    @property
    def tombstone(self) -> bool:
        return not self.payload


def seal_entry(signer: Identity, *, key: str, payload: bytes, signed_at: float, expires_at: float) -> bytes:
    """Sign ``payload`` for ``key`` until ``expires_at``; it goes under the subkey ``signer.peer_id``."""
    if not isinstance(payload, bytes):
        raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
    for name, value in (("signed_at", signed_at), ("expires_at", expires_at)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{name}: must be a finite DHT time, got {value!r}")
    body = {"key": key, "payload": payload, "signed_at": float(signed_at), "expires_at": float(expires_at)}
    return seal_body(signer, body, domain=ENTRY_DOMAIN)


def open_entry(blob: bytes, *, subkey: str, max_payload_bytes: int) -> Entry:
    """Verify an entry found under ``subkey``: signature, signer = subkey, fields; EntryRefused otherwise."""
    entry, signed = _parse(blob, subkey=subkey, max_payload_bytes=max_payload_bytes)
    try:
        signed.verify(ENTRY_DOMAIN)
    except VerificationError as exc:
        raise EntryRefused("the entry's signature does not verify", reason="signature") from exc
    return entry


def read_entry(blob: bytes, *, subkey: str, max_payload_bytes: int) -> Entry:
    """Decode an entry whose exact bytes ``open_entry`` has verified before (no signature check)."""
    return _parse(blob, subkey=subkey, max_payload_bytes=max_payload_bytes)[0]


def _parse(blob: bytes, *, subkey: str, max_payload_bytes: int) -> tuple[Entry, SignedBlob]:
    if not isinstance(subkey, str) or not _PEER_ID.fullmatch(subkey):
        raise EntryRefused(f"subkey {str(subkey)[:80]!r} is not a peer id", reason="subkey")
    max_bytes = max_payload_bytes + ENTRY_OVERHEAD_BYTES
    try:
        signed = unwrap(blob, max_bytes=max_bytes)
        body = decode_body(signed, max_bytes=max_bytes)
    except VerificationError as exc:
        raise EntryRefused("value is not a signed entry", reason="malformed") from exc
    if peer_id_of(signed.public_key) != subkey:
        raise EntryRefused(f"entry under subkey {subkey[:12]} is signed by {peer_id_of(signed.public_key)[:12]}",
                           reason="subkey")
    key, payload = body.get("key"), body.get("payload")
    signed_at, expires_at = body.get("signed_at"), body.get("expires_at")
    if (body.keys() != _FIELDS or not isinstance(key, str) or not isinstance(payload, bytes)
            or not _is_time(signed_at) or not _is_time(expires_at)):
        raise EntryRefused("entry fields are missing or of the wrong type", reason="malformed")
    if len(payload) > max_payload_bytes:
        raise EntryRefused(f"payload of {len(payload)} bytes is over {max_payload_bytes}", reason="size")
    return Entry(key=key, subkey=subkey, payload=payload, signed_at=signed_at, expires_at=expires_at), signed


def _is_time(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value)
