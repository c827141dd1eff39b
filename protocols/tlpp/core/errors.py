"""TL++'s error type and the count check that raises it, naming the field."""

from __future__ import annotations

from gossamer.protocols.core.errors import ProtocolError


class TraversalError(ProtocolError):
    """A TL++ input or model that cannot work; the message names the field or layer."""


def check_count(name: str, value: object, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TraversalError(f"{name}: must be an int >= {low}, got {value!r}")
    return value
