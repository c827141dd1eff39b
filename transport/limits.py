"""Hard caps on everything a peer can claim, checked before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Caps applied by every decoder in ``transport``.

    Attributes:
        max_header_bytes: largest msgpack header of a frame (or JSON header of a safetensors body).
        max_payload_bytes: largest payload of one frame or body of one HTTP object.
        max_tensors: most tensors described by one header.
        max_ndim: most dimensions of one tensor.
        max_depth: deepest nesting of maps/arrays in a decoded header.
        max_name_bytes: longest tensor name (UTF-8 bytes).
        max_str_bytes: longest string anywhere in a header.
        max_container_len: longest array or map anywhere in a header.
    """

    max_header_bytes: int = 1 << 20
    max_payload_bytes: int = 4 << 30
    max_tensors: int = 65_536
    max_ndim: int = 8
    max_depth: int = 16
    max_name_bytes: int = 512
    max_str_bytes: int = 1 << 16
    max_container_len: int = 1 << 17

    def __post_init__(self) -> None:
        for field in ("max_header_bytes", "max_payload_bytes", "max_tensors", "max_ndim", "max_depth",
                      "max_name_bytes", "max_str_bytes", "max_container_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{field} must be a positive int, got {value!r}")


DEFAULT_LIMITS = Limits()
