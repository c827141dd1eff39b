"""What travels on a secure link: its errors, one message (op, step, fields, tensors), the
plaintext body a message is packed into, and the associated data each frame is bound to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gossamer.peer.errors import PeerError
from gossamer.transport.codec import decode_tensors, encode_tensors
from gossamer.transport.errors import DecodeError
from gossamer.transport.header import pack_header, unpack_header
from gossamer.transport.limits import Limits

COOKIE = "cookie"
HELLO = "hello"
CONFIRM = "confirm"
ERROR_OP = "error"
MAX_OP_CHARS = 32
_LENGTH_BYTES = 4


class SecureLinkError(PeerError):
    """The link failed and was closed; the message names the peer and what happened."""


class RequestRefused(PeerError):
    """The other side refused a request (``code``: a short category such as "refused",
    "stale", "helper"); the message says why."""

    def __init__(self, message: str, *, code: str = "refused") -> None:
        super().__init__(message)
        self.code = code


@dataclass
class LinkMessage:
    """One request or reply: an op, the step it belongs to, small fields and named tensors."""

    op: str
    step: int
    fields: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def pack_body(message: LinkMessage) -> bytes:
    """The plaintext of a message: 4-byte length, msgpack {fields, tensors}, the tensors' bytes."""
    entries, buffers = encode_tensors({k: t.detach().cpu().contiguous() for k, t in message.tensors.items()})
    meta = pack_header({"fields": message.fields, "tensors": entries})
    return b"".join([len(meta).to_bytes(_LENGTH_BYTES, "big"), meta, *buffers])


def unpack_body(op: str, step: int, body: bytes, *, limits: Limits) -> LinkMessage:
    """Inverse of ``pack_body``; DecodeError for anything malformed (floats must be finite)."""
    view = memoryview(body)
    if view.nbytes < _LENGTH_BYTES:
        raise DecodeError("secure link body is shorter than its length prefix")
    size = int.from_bytes(view[:_LENGTH_BYTES], "big")
    if _LENGTH_BYTES + size > view.nbytes:
        raise DecodeError(f"secure link body declares {size} header bytes but has {view.nbytes - _LENGTH_BYTES}")
    meta = unpack_header(view[_LENGTH_BYTES:_LENGTH_BYTES + size], limits=limits)
    if not isinstance(meta, dict) or set(meta) != {"fields", "tensors"} or not isinstance(meta["fields"], dict):
        raise DecodeError("secure link body header must be a map {fields: map, tensors: list}")
    payload = bytearray(view[_LENGTH_BYTES + size:])
    tensors = decode_tensors(meta["tensors"], payload, limits=limits, require_finite=True)
    return LinkMessage(op=op, step=step, fields=meta["fields"], tensors=tensors)


def traffic_kind(method: str, op: str) -> str:
    """The traffic counter a link's op is counted under: the method's first word (its protocol)
    and the op, e.g. ``tlpp-node`` and ``forward`` -> ``tlpp_forward``."""
    return f"{method.partition('-')[0]}_{op}"


def associated_data(sid: str, op: str, step: int, direction: str) -> bytes:
    """What each frame's ciphertext is bound to: its session, op, step and direction."""
    return pack_header([sid, op, step, direction])


def check_op(op: object, step: object) -> tuple[str, int]:
    """(op, step) of a frame's clear header; DecodeError unless well formed."""
    if not isinstance(op, str) or not 0 < len(op) <= MAX_OP_CHARS:
        raise DecodeError(f"secure link frame has a bad op {op!r:.40}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise DecodeError(f"secure link frame has a bad step {step!r:.40}")
    return op, step
