"""Per-frame channel encryption for private contents (TL++ shares). Pure: no I/O.

Handshake (one message each way, in any order)::

    hello = sign_ed25519(domain || {eph: X25519 public, run: run id, role: initiator|responder})

Each side knows the other's Ed25519 public key in advance (from its signed peer record) and
refuses a hello signed by any other key, for another run, or claiming its own role (so a hello
reflected back is refused). Both sides then compute the X25519 shared secret of the two ephemeral
keys and derive, with HKDF-SHA256 over an info string that binds both ephemeral keys, both
identities and the run id, two 32-byte keys: initiator->responder and responder->initiator.

Frames: ChaCha20-Poly1305, nonce = a 96-bit big-endian counter per direction, starting at 0. The
counter is implicit (never sent): the receiver expects exactly the next frame, so a tampered,
reordered, replayed, dropped or truncated frame, or one with other associated data, fails. The
first failure poisons the receiving side: every later ``decrypt`` fails too, and the caller
should drop the connection. Ephemeral keys give forward secrecy: each session has fresh keys.
"""

from __future__ import annotations

from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gossamer.crypto.errors import CryptoError, VerificationError
from gossamer.crypto.identity import PUBLIC_KEY_BYTES, Identity
from gossamer.crypto.signed import canonical_bytes, open_body, seal_body

HELLO_DOMAIN = b"gossamer-channel-hello-v1\0"
KDF_DOMAIN = b"gossamer-channel-keys-v1\0"
X25519_KEY_BYTES = 32
CHANNEL_KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MAX_COUNTER = (1 << 96) - 1
"""The last nonce value a direction may use; after it the channel refuses to go on."""
MAX_HELLO_BYTES = 2048
_ROLES = ("initiator", "responder")
_HELLO_FIELDS = frozenset({"eph", "run", "role"})


class SecureChannel:
    """Both directions of one encrypted session; build it with ``ChannelHandshake.finish``."""

    def __init__(
        self, *, send_key: bytes, recv_key: bytes, send_counter: int = 0, recv_counter: int = 0
    ) -> None:
        if len(send_key) != CHANNEL_KEY_BYTES or len(recv_key) != CHANNEL_KEY_BYTES:
            raise ValueError(f"send_key and recv_key must be {CHANNEL_KEY_BYTES} bytes")
        if not (0 <= send_counter <= MAX_COUNTER + 1 and 0 <= recv_counter <= MAX_COUNTER + 1):
            raise ValueError(f"send_counter and recv_counter must be in [0, {MAX_COUNTER + 1}]")
        self._send = ChaCha20Poly1305(send_key)
        self._recv = ChaCha20Poly1305(recv_key)
        self._send_counter = send_counter
        self._recv_counter = recv_counter
        self._broken = False

    @property
    def frames_sent(self) -> int:
        """Frames encrypted so far (the next send nonce)."""
        return self._send_counter

    @property
    def frames_received(self) -> int:
        """Frames decrypted so far (the next expected nonce)."""
        return self._recv_counter

    def encrypt(self, plaintext: bytes | memoryview, associated_data: bytes = b"") -> bytes:
        """Encrypt the next frame; returns ciphertext + 16-byte tag. CryptoError once the counter is spent."""
        if self._send_counter > MAX_COUNTER:
            raise CryptoError("channel send counter exhausted; open a new channel")
        nonce = self._send_counter.to_bytes(NONCE_BYTES, "big")
        ciphertext = self._send.encrypt(nonce, plaintext, associated_data)
        self._send_counter += 1
        return ciphertext

    def decrypt(self, ciphertext: bytes | memoryview, associated_data: bytes = b"") -> bytes:
        """Decrypt the next frame in order; VerificationError (and a dead channel) on any mismatch."""
        if self._broken or self._recv_counter > MAX_COUNTER:
            raise VerificationError()
        nonce = self._recv_counter.to_bytes(NONCE_BYTES, "big")
        try:
            plaintext = self._recv.decrypt(nonce, ciphertext, associated_data)
        except (InvalidTag, ValueError, TypeError) as exc:
            self._broken = True
            raise VerificationError() from exc
        self._recv_counter += 1
        return plaintext


class ChannelHandshake:
    """One side of the key agreement; ``hello()`` goes to the peer, ``finish(peer_hello)`` makes the channel."""

    def __init__(
        self,
        identity: Identity,
        *,
        peer_public_key: bytes,
        run_id: str,
        initiator: bool,
        ephemeral: bytes | None = None,
    ) -> None:
        if not isinstance(peer_public_key, bytes) or len(peer_public_key) != PUBLIC_KEY_BYTES:
            raise ValueError(f"peer_public_key must be {PUBLIC_KEY_BYTES} raw Ed25519 bytes")
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("run_id must be a non-empty str")
        if ephemeral is not None and (not isinstance(ephemeral, bytes) or len(ephemeral) != X25519_KEY_BYTES):
            raise ValueError(f"ephemeral must be {X25519_KEY_BYTES} raw X25519 private key bytes")
        self._identity = identity
        self._peer_public_key = peer_public_key
        self._run_id = run_id
        self._initiator = bool(initiator)
        self._ephemeral = (
            X25519PrivateKey.from_private_bytes(ephemeral)
            if ephemeral is not None
            else X25519PrivateKey.generate()
        )
        self._ephemeral_public = self._ephemeral.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    @property
    def role(self) -> str:
        """``initiator`` or ``responder``."""
        return _ROLES[0] if self._initiator else _ROLES[1]

    def hello(self) -> bytes:
        """Our ephemeral X25519 public key, signed with our identity and bound to the run and role."""
        body = {"eph": self._ephemeral_public, "run": self._run_id, "role": self.role}
        return seal_body(self._identity, body, domain=HELLO_DOMAIN)

    def finish(self, peer_hello: bytes) -> SecureChannel:
        """Verify the peer's hello and derive the channel keys; VerificationError on any mismatch."""
        peer_ephemeral = self._open_peer_hello(peer_hello)
        try:
            shared = self._ephemeral.exchange(X25519PublicKey.from_public_bytes(peer_ephemeral))
        except ValueError as exc:  # a low-order point gives an all-zero secret, which is refused
            raise VerificationError() from exc
        keys = HKDF(
            algorithm=hashes.SHA256(),
            length=2 * CHANNEL_KEY_BYTES,
            salt=None,
            info=self._kdf_info(peer_ephemeral),
        ).derive(shared)
        to_responder, to_initiator = keys[:CHANNEL_KEY_BYTES], keys[CHANNEL_KEY_BYTES:]
        if self._initiator:
            return SecureChannel(send_key=to_responder, recv_key=to_initiator)
        return SecureChannel(send_key=to_initiator, recv_key=to_responder)

    def _open_peer_hello(self, peer_hello: bytes) -> bytes:
        """Check signer, run and role of the peer's hello; return its ephemeral public key."""
        body, _ = open_body(
            peer_hello,
            domain=HELLO_DOMAIN,
            max_bytes=MAX_HELLO_BYTES,
            expected_public_key=self._peer_public_key,
        )
        peer_role = _ROLES[1] if self._initiator else _ROLES[0]
        ok = (
            body.keys() == _HELLO_FIELDS
            and body["run"] == self._run_id
            and body["role"] == peer_role
            and isinstance(body["eph"], bytes)
            and len(body["eph"]) == X25519_KEY_BYTES
        )
        if not ok:
            raise VerificationError()
        return body["eph"]

    def _kdf_info(self, peer_ephemeral: bytes) -> bytes:
        """HKDF info: both ephemeral keys, both identities (by role) and the run id, unambiguously encoded."""
        mine: dict[str, Any] = {"eph": self._ephemeral_public, "id": self._identity.public_key}
        theirs: dict[str, Any] = {"eph": peer_ephemeral, "id": self._peer_public_key}
        initiator, responder = (mine, theirs) if self._initiator else (theirs, mine)
        return KDF_DOMAIN + canonical_bytes(
            {"initiator": initiator, "responder": responder, "run": self._run_id}
        )
