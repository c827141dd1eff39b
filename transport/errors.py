"""The transport's exception tree (drawn in the package docstring).

Every error that crosses the transport boundary is one of these; foreign exceptions are chained
as ``__cause__`` so nothing is lost for debugging, but callers only ever catch ours.
"""

from __future__ import annotations


class TransportError(Exception):
    """Base of every error the transport raises."""


class DecodeError(TransportError):
    """Bytes from a peer do not parse as what they claim to be."""


class LimitExceeded(DecodeError):
    """A length, count, nesting depth or total size claimed by a peer is over a configured cap."""


class NonFiniteTensor(DecodeError):
    """A tensor holds NaN or Inf and the caller asked for finite values only."""


class ConnectionClosed(TransportError):
    """The peer closed or reset the connection (possibly in the middle of a frame)."""


class TransportTimeout(TransportError):
    """A deadline passed: connect, read of a frame part, or a whole request."""


class Overloaded(TransportError):
    """A connection cap or a bounded queue is full; the request was refused, not queued."""


class RemoteError(TransportError):
    """The peer answered with an error (an ERROR frame, or an HTTP error status)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
