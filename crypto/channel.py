"""Per-frame channel encryption for secure links (keys from ``handshake``). Pure: ChaCha20-Poly1305
with an implicit 96-bit counter per direction, so a tampered, reordered, replayed, dropped or
truncated frame fails, and the first failure poisons the receiving side."""

from __future__ import annotations

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from gossamer.crypto.errors import CryptoError, VerificationError

CHANNEL_KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MAX_COUNTER = (1 << 96) - 1
"""The last nonce value a direction may use; after it the channel refuses to go on."""


class SecureChannel:
    """Both directions of one encrypted session; built by ``crypto.handshake`` (``Initiator.finish``, ``Responder.confirm``)."""

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
