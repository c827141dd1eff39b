"""The TCP frame: a fixed prefix (magic ``GSMR``, version, type, header and payload lengths), a msgpack
header, then the payload (README.md, "The TCP frame"). Pure: ``parse_prefix`` checks every claimed
length against the limits before a reader allocates anything."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy

from gossamer.transport.errors import DecodeError, LimitExceeded
from gossamer.transport.header import pack_header, unpack_header
from gossamer.transport.limits import DEFAULT_LIMITS, Limits

PREFIX = struct.Struct("!4sBBIQ")
PREFIX_BYTES = PREFIX.size
MAGIC = b"GSMR"
VERSION = 1
MAX_HEADER_LEN = (1 << 32) - 1
MAX_PAYLOAD_LEN = (1 << 64) - 1

Buffer = bytes | bytearray | memoryview
LARGE_BUFFER_BYTES = 1 << 20
"""Received payloads from this size are allocated by numpy, which asks the kernel for huge pages:
faulting in a fresh 100 MB bytearray 4 KiB at a time costs about as much as receiving it."""


class FrameType(IntEnum):
    """What a frame is for; the u8 after the version byte."""

    REQUEST = 1
    RESPONSE = 2
    ONEWAY = 3
    ERROR = 4


@dataclass
class Frame:
    """One frame: its type, a header map with str keys, and the payload.

    ``payload`` is any object exporting the buffer protocol (bytes, bytearray, memoryview, a
    contiguous numpy array). On the send side it may also be a list or tuple of such buffers, sent
    back to back without being concatenated; received frames always hold a single buffer.
    """

    type: FrameType
    header: dict[str, Any] = field(default_factory=dict)
    payload: Buffer | list[Buffer] | tuple[Buffer, ...] = b""

    def payload_views(self) -> list[memoryview]:
        """The payload as a list of flat byte views (no copy)."""
        parts = self.payload if isinstance(self.payload, list | tuple) else [self.payload]
        return [_byte_view(part) for part in parts]


def _byte_view(buffer: Buffer) -> memoryview:
    view = memoryview(buffer)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def allocate_buffer(nbytes: int) -> bytearray | memoryview:
    """A zero-filled writable buffer of ``nbytes`` for a received payload or body."""
    if nbytes >= LARGE_BUFFER_BYTES:
        return memoryview(numpy.zeros(nbytes, dtype=numpy.uint8))
    return bytearray(nbytes)


def encode_prefix(frame_type: FrameType | int, header_len: int, payload_len: int) -> bytes:
    """Pack the fixed prefix; raises ValueError for lengths that do not fit their fields."""
    if not 0 <= header_len <= MAX_HEADER_LEN:
        raise ValueError(f"header_len {header_len} does not fit in u32")
    if not 0 <= payload_len <= MAX_PAYLOAD_LEN:
        raise ValueError(f"payload_len {payload_len} does not fit in u64")
    return PREFIX.pack(MAGIC, VERSION, FrameType(frame_type), header_len, payload_len)


def parse_prefix(prefix: Buffer, *, limits: Limits = DEFAULT_LIMITS) -> tuple[FrameType, int, int]:
    """Parse and check the fixed prefix; every claimed length is checked against ``limits``."""
    if len(prefix) != PREFIX_BYTES:
        raise DecodeError(f"frame prefix must be {PREFIX_BYTES} bytes, got {len(prefix)}")
    magic, version, type_code, header_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise DecodeError(f"bad magic {bytes(magic)!r}: not a gossamer frame")
    if version != VERSION:
        raise DecodeError(f"unknown frame version {version}")
    try:
        frame_type = FrameType(type_code)
    except ValueError:
        raise DecodeError(f"unknown frame type {type_code}") from None
    if header_len > limits.max_header_bytes:
        raise LimitExceeded(f"header_len {header_len} exceeds max_header_bytes={limits.max_header_bytes}")
    if payload_len > limits.max_payload_bytes:
        raise LimitExceeded(f"payload_len {payload_len} exceeds max_payload_bytes={limits.max_payload_bytes}")
    return frame_type, header_len, payload_len


def decode_header(data: Buffer, *, limits: Limits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Decode a frame header: capped msgpack that must be a map with str keys."""
    header = unpack_header(data, limits=limits)
    if not isinstance(header, dict):
        raise DecodeError(f"frame header must be a map, got {type(header).__name__}")
    for key in header:
        if not isinstance(key, str):
            raise DecodeError(f"frame header keys must be str, got {type(key).__name__}")
    return header


def encode_header(header: dict[str, Any]) -> bytes:
    """Pack a frame header; raises TypeError for a non-map, non-str keys or unpackable values."""
    if not isinstance(header, dict) or not all(isinstance(key, str) for key in header):
        raise TypeError("frame header must be a dict with str keys")
    return pack_header(header)


def encode_frame(frame: Frame) -> list[bytes | memoryview]:
    """The frame as buffers to send back to back: prefix + header, then the payload views."""
    header_bytes = encode_header(frame.header)
    views = [view for view in frame.payload_views() if view.nbytes]
    payload_len = sum(view.nbytes for view in views)
    return [encode_prefix(frame.type, len(header_bytes), payload_len) + header_bytes, *views]


def decode_frame(data: Buffer, *, limits: Limits = DEFAULT_LIMITS) -> Frame:
    """Decode exactly one whole frame from ``data``; the payload is a zero-copy view into it."""
    view = _byte_view(data)
    if view.nbytes < PREFIX_BYTES:
        raise DecodeError(f"frame is truncated: {view.nbytes} bytes, prefix needs {PREFIX_BYTES}")
    frame_type, header_len, payload_len = parse_prefix(view[:PREFIX_BYTES], limits=limits)
    expected = PREFIX_BYTES + header_len + payload_len
    if view.nbytes < expected:
        raise DecodeError(f"frame is truncated: {view.nbytes} of {expected} bytes")
    if view.nbytes > expected:
        raise DecodeError(f"frame has {view.nbytes - expected} trailing bytes")
    header = decode_header(view[PREFIX_BYTES:PREFIX_BYTES + header_len], limits=limits)
    return Frame(frame_type, header, view[PREFIX_BYTES + header_len:])
