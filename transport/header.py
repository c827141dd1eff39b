"""msgpack headers with hard limits: the one place peer-supplied msgpack is decoded. Plain maps of str
keys; length checked before parsing, per-object caps while parsing, no ext types, no trailing
bytes, bounded nesting."""

from __future__ import annotations

from typing import Any

import msgpack

from gossamer.transport.errors import DecodeError, LimitExceeded
from gossamer.transport.limits import DEFAULT_LIMITS, Limits


def pack_header(obj: Any) -> bytes:
    """Encode a header object; raises TypeError for values msgpack cannot represent."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack_header(data: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Decode one msgpack object from exactly ``data``; raise DecodeError/LimitExceeded otherwise."""
    data = memoryview(data).cast("B") if isinstance(data, memoryview) else data
    if len(data) > limits.max_header_bytes:
        raise LimitExceeded(f"header of {len(data)} bytes exceeds max_header_bytes={limits.max_header_bytes}")
    unpacker = msgpack.Unpacker(
        max_buffer_size=max(len(data), 1),
        max_str_len=limits.max_str_bytes,
        max_bin_len=limits.max_header_bytes,
        max_array_len=limits.max_container_len,
        max_map_len=limits.max_container_len,
        max_ext_len=0,
        strict_map_key=True,
        ext_hook=_refuse_ext,
    )
    try:
        unpacker.feed(data)
        obj = unpacker.unpack()
    except msgpack.OutOfData as exc:
        raise DecodeError("header is truncated") from exc
    except msgpack.StackError as exc:
        raise LimitExceeded(f"header nests deeper than msgpack's stack (max_depth={limits.max_depth})") from exc
    except (msgpack.ExtraData, msgpack.FormatError, UnicodeDecodeError, TypeError) as exc:
        raise DecodeError(f"header is not valid msgpack: {exc or type(exc).__name__}") from exc
    except ValueError as exc:  # after the ValueError subclasses above: msgpack's length caps
        raise LimitExceeded(f"header exceeds a limit: {exc or type(exc).__name__}") from exc
    if unpacker.tell() != len(data):
        raise DecodeError(f"header has {len(data) - unpacker.tell()} trailing bytes")
    check_depth(obj, limits.max_depth)
    _check_keys(obj)
    return obj


def _refuse_ext(code: int, data: bytes) -> None:
    raise DecodeError(f"header holds a msgpack ext type ({code}); ext types are not allowed")


def _check_keys(obj: Any) -> None:
    """Every map key is a str (msgpack's strict_map_key still admits bytes keys)."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                raise DecodeError("header map keys must be strings")
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def check_depth(obj: Any, max_depth: int) -> None:
    """Raise LimitExceeded if maps/lists nest deeper than ``max_depth`` (iterative, no recursion)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > max_depth:
            raise LimitExceeded(f"header nests deeper than max_depth={max_depth}")
        stack.extend((child, depth + 1) for child in children)
