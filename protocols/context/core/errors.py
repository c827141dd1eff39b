"""The context package's exception tree (a branch of ``protocols.core.errors.ProtocolError``)::

    ProtocolError
     └── ContextError           a context-parallel input that cannot work
          ├── InvalidRing       a ring or model set-up that cannot work (names the field)
          └── MessageRefused    a coefficient message that must not be used; ``code`` says why:
               │                "header", "shape", "dtype", "nonfinite", "index", "length",
               │                "order" (not this member's to take, or a duplicate)
               └── BasisMismatch  the sender's basis hash differs from ours (code "basis")

A refused message changes nothing in the member that refused it: it can go on serving.
"""

from __future__ import annotations

from gossamer.protocols.core.errors import ProtocolError


class ContextError(ProtocolError):
    """Base of every error ``protocols.context.core`` raises on purpose."""


class InvalidRing(ContextError, ValueError):
    """A ring, model or batch set-up that cannot work; the message names the field."""


class MessageRefused(ContextError, ValueError):
    """A coefficient message that must not be used; ``code`` names the check it failed."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class BasisMismatch(MessageRefused):
    """The message was coded with other bases than ours (its hash differs): using it would
    silently corrupt the attention, so it is refused."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="basis")
