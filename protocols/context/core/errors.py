"""The context core's errors (drawn in ``protocols.core.errors``' tree): ``InvalidRing`` for a set-up
that cannot work, ``MessageRefused`` (``code`` says which check) and ``BasisMismatch`` for a
coefficient message that must not be used; a refused message changes nothing.
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
