"""The authenticated X25519 + HKDF key agreement that opens a ``channel.SecureChannel``: three signed
messages and an acknowledgement bound to one transcript, with key confirmation both ways. Pure;
every refusal is the opaque ``VerificationError`` (README.md, "The handshake")."""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gossamer.crypto.channel import CHANNEL_KEY_BYTES, SecureChannel
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import PUBLIC_KEY_BYTES, Identity
from gossamer.crypto.signed import canonical_bytes, open_body, seal_body

HELLO_DOMAIN = b"gossamer-channel-hello-v2\0"
ANSWER_DOMAIN = b"gossamer-channel-answer-v2\0"
CONFIRM_DOMAIN = b"gossamer-channel-confirm-v2\0"
TRANSCRIPT_DOMAIN = b"gossamer-channel-transcript-v2\0"
KDF_DOMAIN = b"gossamer-channel-keys-v2\0"
X25519_KEY_BYTES = 32
HANDSHAKE_NONCE_BYTES = 16
MAX_HELLO_BYTES = 2048
"""The largest hello, answer or confirmation either side reads."""
_HELLO_FIELDS = frozenset({"eph", "nonce", "run", "to"})
_ANSWER_FIELDS = _HELLO_FIELDS | {"hello"}


class _Side:
    """What both ends hold: identities, run, a fresh ephemeral key and nonce."""

    def __init__(self, identity: Identity, *, peer_public_key: bytes, run_id: str, ephemeral: bytes | None,
                 nonce: bytes | None) -> None:
        if not isinstance(peer_public_key, bytes) or len(peer_public_key) != PUBLIC_KEY_BYTES:
            raise ValueError(f"peer_public_key must be {PUBLIC_KEY_BYTES} raw Ed25519 bytes")
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("run_id must be a non-empty str")
        if ephemeral is not None and (not isinstance(ephemeral, bytes) or len(ephemeral) != X25519_KEY_BYTES):
            raise ValueError(f"ephemeral must be {X25519_KEY_BYTES} raw X25519 private key bytes")
        if nonce is not None and (not isinstance(nonce, bytes) or len(nonce) != HANDSHAKE_NONCE_BYTES):
            raise ValueError(f"nonce must be {HANDSHAKE_NONCE_BYTES} bytes")
        self._identity = identity
        self._peer_key = peer_public_key
        self._run_id = run_id
        self._ephemeral = (X25519PrivateKey.from_private_bytes(ephemeral) if ephemeral is not None
                           else X25519PrivateKey.generate())
        self._eph_public = self._ephemeral.public_key().public_bytes(serialization.Encoding.Raw,
                                                                     serialization.PublicFormat.Raw)
        self._nonce = nonce if nonce is not None else os.urandom(HANDSHAKE_NONCE_BYTES)

    def _open(self, blob: bytes, *, domain: bytes, fields: frozenset[str]) -> dict[str, Any]:
        """A message from the peer, signed by its key under ``domain``, for this run and this side."""
        if not isinstance(blob, bytes | bytearray | memoryview):
            raise VerificationError()
        body, _ = open_body(bytes(blob), domain=domain, max_bytes=MAX_HELLO_BYTES,
                            expected_public_key=self._peer_key)
        ok = (body.keys() == fields and body["run"] == self._run_id and body["to"] == self._identity.public_key
              and _is_bytes(body["eph"], X25519_KEY_BYTES) and _is_bytes(body["nonce"], HANDSHAKE_NONCE_BYTES))
        if not ok:
            raise VerificationError()
        return body

    def _message(self, domain: bytes, **extra: Any) -> bytes:
        body = {"eph": self._eph_public, "nonce": self._nonce, "run": self._run_id, "to": self._peer_key, **extra}
        return seal_body(self._identity, body, domain=domain)

    def _keys(self, peer_eph: bytes, transcript: bytes, *, initiator: bool) -> tuple[bytes, bytes]:
        """(send key, receive key) of this side."""
        try:
            shared = self._ephemeral.exchange(X25519PublicKey.from_public_bytes(peer_eph))
        except ValueError as exc:  # a low-order point gives an all-zero secret, which is refused
            raise VerificationError() from exc
        keys = HKDF(algorithm=hashes.SHA256(), length=2 * CHANNEL_KEY_BYTES, salt=transcript,
                    info=KDF_DOMAIN + canonical_bytes(self._parties(initiator))).derive(shared)
        to_responder, to_initiator = keys[:CHANNEL_KEY_BYTES], keys[CHANNEL_KEY_BYTES:]
        return (to_responder, to_initiator) if initiator else (to_initiator, to_responder)

    def _parties(self, initiator: bool) -> dict[str, Any]:
        mine, theirs = self._identity.public_key, self._peer_key
        first, second = (mine, theirs) if initiator else (theirs, mine)
        return {"initiator": first, "responder": second, "run": self._run_id}

    def _transcript(self, hello: bytes, answer: bytes, *, initiator: bool) -> bytes:
        body = {**self._parties(initiator), "hello": hello, "answer": answer}
        return hashlib.sha256(TRANSCRIPT_DOMAIN + canonical_bytes(body)).digest()


class Initiator(_Side):
    """The dialling side: ``hello()``, then ``confirm(answer)``, then ``finish(ack)``."""

    def __init__(self, identity: Identity, *, peer_public_key: bytes, run_id: str, ephemeral: bytes | None = None,
                 nonce: bytes | None = None) -> None:
        super().__init__(identity, peer_public_key=peer_public_key, run_id=run_id, ephemeral=ephemeral, nonce=nonce)
        self._hello = self._message(HELLO_DOMAIN)
        self._pending: tuple[tuple[bytes, bytes], bytes] | None = None

    def hello(self) -> bytes:
        """Message 1: our ephemeral key and nonce, signed, for this run and the responder's key."""
        return self._hello

    def confirm(self, answer: bytes) -> bytes:
        """Message 3 for the responder's ``answer``; VerificationError unless it is the expected
        key's answer to this very hello."""
        body = self._open(answer, domain=ANSWER_DOMAIN, fields=_ANSWER_FIELDS)
        if not hmac.compare_digest(body["hello"], hashlib.sha256(self._hello).digest()):
            raise VerificationError()
        transcript = self._transcript(self._hello, bytes(answer), initiator=True)
        keys = self._keys(body["eph"], transcript, initiator=True)
        signed = seal_body(self._identity, {"transcript": transcript, "run": self._run_id}, domain=CONFIRM_DOMAIN)
        confirmation = SecureChannel(send_key=keys[0], recv_key=keys[1]).encrypt(signed, transcript)
        self._pending = (keys, transcript)
        return confirmation

    def finish(self, ack: bytes) -> SecureChannel:
        """The channel, once the responder's ``ack`` proves it holds the same keys."""
        if self._pending is None:
            raise ValueError("finish before confirm")
        (send_key, recv_key), transcript = self._pending
        channel = SecureChannel(send_key=send_key, recv_key=recv_key, send_counter=1)
        if not hmac.compare_digest(channel.decrypt(ack, transcript), transcript):
            raise VerificationError()
        return channel


class Responder(_Side):
    """The answering side: ``answer(hello)``, then ``confirm(confirmation)`` gives the channel."""

    def __init__(self, identity: Identity, *, peer_public_key: bytes, run_id: str, ephemeral: bytes | None = None,
                 nonce: bytes | None = None) -> None:
        super().__init__(identity, peer_public_key=peer_public_key, run_id=run_id, ephemeral=ephemeral, nonce=nonce)
        self._pending: tuple[tuple[bytes, bytes], bytes] | None = None

    def answer(self, hello: bytes) -> bytes:
        """Message 2 for the initiator's ``hello``; VerificationError unless the expected key
        signed it for this run and this responder. Nothing is trusted until ``confirm``."""
        body = self._open(hello, domain=HELLO_DOMAIN, fields=_HELLO_FIELDS)
        hello = bytes(hello)
        answer = self._message(ANSWER_DOMAIN, hello=hashlib.sha256(hello).digest())
        transcript = self._transcript(hello, answer, initiator=False)
        self._pending = (self._keys(body["eph"], transcript, initiator=False), transcript)  # a new hello restarts
        return answer

    def confirm(self, confirmation: bytes) -> tuple[SecureChannel, bytes]:
        """(channel, ack) once ``confirmation`` decrypts under the agreed keys and carries the
        initiator's signature over this transcript; VerificationError otherwise."""
        if self._pending is None:
            raise ValueError("confirm before answer")
        (send_key, recv_key), transcript = self._pending
        channel = SecureChannel(send_key=send_key, recv_key=recv_key)
        signed = channel.decrypt(confirmation, transcript)
        body, _ = open_body(signed, domain=CONFIRM_DOMAIN, max_bytes=MAX_HELLO_BYTES,
                            expected_public_key=self._peer_key)
        if body.keys() != {"transcript", "run"} or body["run"] != self._run_id or not (
                isinstance(body["transcript"], bytes) and hmac.compare_digest(body["transcript"], transcript)):
            raise VerificationError()
        ack = channel.encrypt(transcript, transcript)
        self._pending = None
        return channel, ack


def _is_bytes(value: Any, length: int) -> bool:
    return isinstance(value, bytes) and len(value) == length
