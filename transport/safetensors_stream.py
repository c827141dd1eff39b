"""safetensors bodies for HTTP objects and checkpoints: streamed encoding that views the tensors' own
memory, strict decoding that checks every length, key, dtype, shape and offset against ``Limits``
before allocating. No pickle, no ``torch.load`` (README.md, "safetensors bodies")."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gossamer.transport.codec import (
    DTYPES,
    byte_tensor,
    check_finite,
    check_name,
    check_shape,
    dtype_name,
    show,
    tensor_bytes,
    view_tensor,
    writable_buffer,
)
from gossamer.transport.errors import DecodeError, LimitExceeded
from gossamer.transport.header import check_depth
from gossamer.transport.limits import DEFAULT_LIMITS, Limits

ST_DTYPES: Mapping[str, str] = {
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64", "I8": "int8",
    "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool",
}
_ST_NAMES: Mapping[str, str] = {ours: theirs for theirs, ours in ST_DTYPES.items()}
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_METADATA = "__metadata__"
_PREFIX = struct.Struct("<Q")


def _ordered(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor) or name == _METADATA:
            raise TypeError(f"tensors must map str (not {_METADATA!r}) to torch.Tensor, got {name!r}")
        dtype_name(tensor.dtype, name)
    return sorted(tensors.items(), key=lambda item: (-item[1].element_size(), item[0]))


def _header_chunks(ordered: list[tuple[str, torch.Tensor]],
                   metadata: dict[str, str] | None) -> tuple[bytes, bytes, int]:
    """The length prefix, the padded JSON header and the data section's length."""
    header: dict[str, Any] = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("metadata must map str to str")
        header[_METADATA] = dict(metadata)
    offset = 0
    for name, tensor in ordered:
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _ST_NAMES[dtype_name(tensor.dtype, name)], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return _PREFIX.pack(len(text)), text, offset


def encode_safetensors(tensors: Mapping[str, torch.Tensor],
                       metadata: dict[str, str] | None = None) -> tuple[int, list[memoryview]]:
    """Total body length and the chunks to stream: length prefix, JSON header, each tensor's bytes."""
    ordered = _ordered(tensors)
    prefix, header, data_bytes = _header_chunks(ordered, metadata)
    chunks = [memoryview(prefix), memoryview(header)]
    chunks.extend(tensor_bytes(tensor) for _, tensor in ordered)
    return len(prefix) + len(header) + data_bytes, chunks


def safetensors_header_length(prefix: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS) -> int:
    """The JSON header length N from a body's first 8 bytes, checked against ``max_header_bytes``."""
    view = memoryview(prefix).cast("B")
    if view.nbytes < _PREFIX.size:
        raise DecodeError(f"safetensors body of {view.nbytes} bytes is shorter than its 8-byte length prefix")
    (length,) = _PREFIX.unpack(view[:_PREFIX.size])
    if length > limits.max_header_bytes:
        raise LimitExceeded(f"safetensors header of {length} bytes exceeds max_header_bytes={limits.max_header_bytes}")
    if length < 2:
        raise DecodeError(f"safetensors header of {length} bytes cannot hold a JSON object")
    return length


def _refuse_constant(name: str) -> None:
    raise DecodeError(f"safetensors header holds the non-JSON constant {name}")


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise DecodeError("safetensors header has a duplicate key")
    return obj


def _parse_json(raw: memoryview, limits: Limits) -> dict[str, Any]:
    try:
        text = str(raw, "utf-8")
        obj = json.loads(text, object_pairs_hook=_unique_object, parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise DecodeError("safetensors header is not UTF-8") from exc
    except RecursionError as exc:
        raise LimitExceeded("safetensors header nests too deeply") from exc
    except ValueError as exc:  # json.JSONDecodeError, and ints over Python's digit limit
        raise DecodeError(f"safetensors header is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise DecodeError(f"safetensors header must be a JSON object, got {type(obj).__name__}")
    check_depth(obj, limits.max_depth)
    return obj


def _parse_metadata(metadata: object, limits: Limits) -> dict[str, str]:
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise DecodeError("safetensors field '__metadata__' must map str to str")
    for text in (*metadata, *metadata.values()):
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise DecodeError(f"safetensors metadata {show(text)} is not valid UTF-8") from exc
        if size > limits.max_str_bytes:
            raise LimitExceeded(f"safetensors metadata string of {size} bytes exceeds max_str_bytes={limits.max_str_bytes}")
    return metadata


def _parse_entry(name: str, entry: object, limits: Limits) -> tuple[str, tuple[int, ...], int, int]:
    """dtype, shape, begin, end of one tensor entry."""
    where = f"tensor {show(name)}"
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        raise DecodeError(f"{where}: entry must be an object with exactly the keys {sorted(_ENTRY_KEYS)}")
    st_dtype = entry["dtype"]
    if not isinstance(st_dtype, str) or st_dtype not in ST_DTYPES:
        raise DecodeError(f"{where}: field 'dtype' must be one of {sorted(ST_DTYPES)}, got {show(st_dtype)}")
    dtype = ST_DTYPES[st_dtype]
    shape, nbytes = check_shape(entry["shape"], DTYPES[dtype].itemsize, limits, where)
    offsets = entry["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
        raise DecodeError(f"{where}: field 'data_offsets' must be [begin, end] non-negative ints, got {show(offsets)}")
    begin, end = offsets
    if end - begin != nbytes:
        raise DecodeError(f"{where}: field 'data_offsets' spans {end - begin} bytes but shape {list(shape)} "
                          f"of {dtype} needs {nbytes}")
    return dtype, shape, begin, end


def _parse_header(header: dict[str, Any], data_bytes: int, limits: Limits
                  ) -> tuple[dict[str, tuple[str, tuple[int, ...], int, int]], dict[str, str]]:
    metadata = _parse_metadata(header.pop(_METADATA), limits) if _METADATA in header else {}
    if len(header) > limits.max_tensors:
        raise LimitExceeded(f"safetensors header lists {len(header)} tensors, over max_tensors={limits.max_tensors}")
    entries = {check_name(name, limits): _parse_entry(name, entry, limits) for name, entry in header.items()}
    cursor = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if begin != cursor:
            problem = "overlaps the previous tensor" if begin < cursor else f"leaves a gap of {begin - cursor} bytes"
            raise DecodeError(f"tensor {show(name)}: field 'data_offsets' {problem}")
        cursor = end
    if cursor != data_bytes:
        problem = "is truncated" if data_bytes < cursor else f"has {data_bytes - cursor} trailing bytes"
        raise DecodeError(f"safetensors data section of {data_bytes} bytes {problem}: the header declares {cursor}")
    return entries, metadata


def decode_safetensors(buffer: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS,
                       require_finite: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors (CPU views of a writable copy of ``buffer``, or of ``buffer`` itself) and metadata."""
    view = memoryview(buffer)
    view = view.cast("B") if view.c_contiguous else writable_buffer(view)
    size = view.nbytes
    header_bytes = safetensors_header_length(view, limits=limits)
    start = _PREFIX.size + header_bytes
    if size < start:
        raise DecodeError(f"safetensors body of {size} bytes is truncated inside its {header_bytes}-byte header")
    if size - start > limits.max_payload_bytes:
        raise LimitExceeded(f"safetensors data of {size - start} bytes exceeds max_payload_bytes={limits.max_payload_bytes}")
    entries, metadata = _parse_header(_parse_json(view[_PREFIX.size:start], limits), size - start, limits)
    writable = writable_buffer(view)
    whole = byte_tensor(writable)
    tensors: dict[str, torch.Tensor] = {}
    for name, (dtype, shape, begin, end) in entries.items():
        where = f"tensor {show(name)}"
        tensors[name] = view_tensor(whole, start + begin, end - begin, DTYPES[dtype], shape, where)
        if require_finite:
            check_finite(tensors[name], where)
    return tensors, metadata


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_file_atomic(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike[str],
                     metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically: temp file in the same directory, fsync, rename, fsync dir.

    Tensors are moved to the CPU one at a time while writing. On any failure the previous file at
    ``path`` is untouched and the temp file is removed.
    """
    target = Path(path)
    ordered = _ordered(tensors)
    prefix, header, _ = _header_chunks(ordered, metadata)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(prefix)
            file.write(header)
            for _, tensor in ordered:
                file.write(tensor_bytes(tensor))
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_directory(target.parent)


def load_file(path: str | os.PathLike[str], *, limits: Limits = DEFAULT_LIMITS,
              require_finite: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read a safetensors file into one bytearray (``readinto``, no extra copy) and decode it.

    OSError from opening or reading the file propagates; the contents are checked like peer bytes.
    """
    with open(path, "rb", buffering=0) as file:
        size = os.fstat(file.fileno()).st_size
        if size > _PREFIX.size + limits.max_header_bytes + limits.max_payload_bytes:
            raise LimitExceeded(f"safetensors file of {size} bytes exceeds the header and payload caps")
        buffer = bytearray(size)
        view = memoryview(buffer)
        filled = 0
        while filled < size:
            count = file.readinto(view[filled:])
            if not count:
                raise DecodeError(f"safetensors file shrank while read: {filled} of {size} bytes")
            filled += count
        view.release()
    return decode_safetensors(buffer, limits=limits, require_finite=require_finite)
