"""The crypto package's exception tree (drawn in the package docstring)."""

from __future__ import annotations


class CryptoError(Exception):
    """Base of every error ``crypto`` raises."""


class IdentityError(CryptoError):
    """An identity file is missing, malformed, or readable by group/world."""


class VerificationError(CryptoError):
    """A signature, envelope, token or ciphertext did not verify.

    Deliberately opaque: the message never says which check failed, so a prober learns nothing.
    """

    def __init__(self) -> None:
        super().__init__("verification failed")
