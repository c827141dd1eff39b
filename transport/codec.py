"""Tensor codec: one msgpack header entry per tensor (dtype from an allowlist, shape, offsets, optional
fp16/bf16/int8 quantisation) and the tensors' raw little-endian bytes back to back. Everything a
peer claims is checked against ``Limits`` before anything is allocated; decoded tensors view the
payload's memory (README.md, "Tensor codec")."""

from __future__ import annotations

import math
import reprlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gossamer.transport.errors import DecodeError, LimitExceeded, NonFiniteTensor
from gossamer.transport.header import pack_header, unpack_header
from gossamer.transport.limits import DEFAULT_LIMITS, Limits

if sys.byteorder != "little":
    raise ImportError("transport.codec sends raw little-endian bytes; big-endian hosts are not supported")

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
QUANT_DTYPES: Mapping[str, str] = {"fp16": "float16", "bf16": "bfloat16", "int8": "int8"}
_REQUIRED = ("name", "dtype", "shape", "nbytes", "offset")
_FIELDS = frozenset((*_REQUIRED, "quant", "scale", "orig_dtype"))
_F32_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class TensorSpec:
    """One header entry: what a tensor is and where its bytes lie in the payload.

    ``dtype`` is the dtype of the bytes on the wire; with ``quant`` set, ``orig_dtype`` is the dtype
    the receiver restores and ``scale`` (int8 only) the dequantisation factor.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    quant: str | None = None
    scale: float | None = None
    orig_dtype: str | None = None

    def to_header(self) -> dict[str, Any]:
        """The msgpack-ready map for this entry (quantisation fields only when quantised)."""
        entry: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                                 "nbytes": self.nbytes, "offset": self.offset}
        if self.quant is not None:
            entry["quant"] = self.quant
            entry["orig_dtype"] = self.orig_dtype
            if self.scale is not None:
                entry["scale"] = float(self.scale)
        return entry

    @classmethod
    def from_header(cls, entry: object, *, limits: Limits = DEFAULT_LIMITS) -> TensorSpec:
        """Validate one peer-supplied entry; raise DecodeError/LimitExceeded naming the bad field."""
        if not isinstance(entry, dict):
            raise DecodeError(f"tensor entry must be a map, got {type(entry).__name__}")
        _check_keys(entry)
        name = check_name(entry["name"], limits)
        where = f"tensor {show(name)}"
        dtype = _check_dtype(entry["dtype"], "dtype", where)
        nbytes = _check_size(entry["nbytes"], "nbytes", where, limits)
        offset = _check_size(entry["offset"], "offset", where, limits)
        shape, expected = check_shape(entry["shape"], DTYPES[dtype].itemsize, limits, where)
        if nbytes != expected:
            raise DecodeError(f"{where}: field 'nbytes'={nbytes} does not match shape {list(shape)} "
                              f"of {dtype} ({expected} bytes)")
        quant, scale, orig_dtype = _check_quant(entry, dtype, shape, where, limits)
        return cls(name=name, dtype=dtype, shape=shape, nbytes=nbytes, offset=offset,
                   quant=quant, scale=scale, orig_dtype=orig_dtype)


def show(value: object) -> str:
    """A short repr of a peer-supplied value for error messages."""
    try:
        return reprlib.repr(value)
    except ValueError:  # an int too long to print
        return f"<{type(value).__name__}>"


def check_name(name: object, limits: Limits) -> str:
    """Validate a tensor name: a str of valid UTF-8 of at most ``limits.max_name_bytes`` bytes."""
    if not isinstance(name, str):
        raise DecodeError(f"field 'name' must be a str, got {type(name).__name__}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise DecodeError(f"field 'name' {show(name)} is not valid UTF-8") from exc
    if size > limits.max_name_bytes:
        raise LimitExceeded(f"field 'name' of {size} bytes exceeds max_name_bytes={limits.max_name_bytes}")
    return name


def check_shape(shape: object, itemsize: int, limits: Limits, where: str) -> tuple[tuple[int, ...], int]:
    """Validate a claimed shape; return it and its byte size, refusing sizes over the payload cap.

    Zero dims are allowed, but the other dims still have to fit the cap: a shape the tensor could
    not hold if it were non-empty is refused (it would overflow torch's strides).
    """
    if not isinstance(shape, list | tuple):
        raise DecodeError(f"{where}: field 'shape' must be a list, got {type(shape).__name__}")
    if len(shape) > limits.max_ndim:
        raise LimitExceeded(f"{where}: field 'shape' has {len(shape)} dims, over max_ndim={limits.max_ndim}")
    span = itemsize
    for dim in shape:
        if not _is_int(dim) or dim < 0:
            raise DecodeError(f"{where}: field 'shape' must hold non-negative ints, got {show(dim)}")
        span *= max(dim, 1)
        if span > limits.max_payload_bytes:
            raise LimitExceeded(f"{where}: field 'shape' {show(shape)} exceeds "
                                f"max_payload_bytes={limits.max_payload_bytes}")
    return tuple(shape), itemsize * math.prod(shape)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_keys(entry: dict[Any, Any]) -> None:
    missing = [key for key in _REQUIRED if key not in entry]
    if missing:
        raise DecodeError(f"tensor entry {show(entry.get('name'))} lacks field(s) {missing}")
    unknown = [show(key) for key in entry if key not in _FIELDS]
    if unknown:
        raise DecodeError(f"tensor entry {show(entry['name'])} has unknown field(s) {', '.join(unknown)}")


def _check_dtype(dtype: object, field: str, where: str) -> str:
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise DecodeError(f"{where}: field '{field}' must be one of {sorted(DTYPES)}, got {show(dtype)}")
    return dtype


def _check_size(value: object, field: str, where: str, limits: Limits) -> int:
    if not _is_int(value) or value < 0:
        raise DecodeError(f"{where}: field '{field}' must be a non-negative int, got {show(value)}")
    if value > limits.max_payload_bytes:
        raise LimitExceeded(f"{where}: field '{field}'={value} exceeds max_payload_bytes={limits.max_payload_bytes}")
    return value


def _check_quant(entry: dict[str, Any], dtype: str, shape: tuple[int, ...], where: str,
                 limits: Limits) -> tuple[str | None, float | None, str | None]:
    quant, scale, orig = entry.get("quant"), entry.get("scale"), entry.get("orig_dtype")
    if quant is None:
        if scale is not None or orig is not None:
            raise DecodeError(f"{where}: fields 'scale' and 'orig_dtype' are only allowed with 'quant'")
        return None, None, None
    if not isinstance(quant, str) or quant not in QUANT_DTYPES:
        raise DecodeError(f"{where}: field 'quant' must be one of {sorted(QUANT_DTYPES)}, got {show(quant)}")
    if dtype != QUANT_DTYPES[quant]:
        raise DecodeError(f"{where}: field 'dtype' must be {QUANT_DTYPES[quant]} with quant {quant!r}, got {dtype}")
    orig = _check_dtype(orig, "orig_dtype", where)
    if orig not in FLOAT_DTYPES:
        raise DecodeError(f"{where}: field 'orig_dtype' must be a floating dtype, got {orig}")
    if quant == "int8" and not (isinstance(scale, float) and math.isfinite(scale) and scale > 0):
        raise DecodeError(f"{where}: field 'scale' must be a positive finite float, got {show(scale)}")
    if quant != "int8" and scale is not None:
        raise DecodeError(f"{where}: field 'scale' is only allowed with quant 'int8'")
    restored = math.prod(shape) * DTYPES[orig].itemsize
    if restored > limits.max_payload_bytes:
        raise LimitExceeded(f"{where}: dequantised size {restored} exceeds max_payload_bytes={limits.max_payload_bytes}")
    return quant, scale, orig


def dtype_name(dtype: torch.dtype, name: str) -> str:
    """The allowlisted name of a torch dtype; ValueError (a local mistake) for anything else."""
    for key, value in DTYPES.items():
        if value == dtype:
            return key
    raise ValueError(f"tensor {name!r}: dtype {dtype} is not one of {sorted(DTYPES)}")


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of ``tensor`` as a read-only byte memoryview; no copy for a contiguous CPU tensor."""
    flat = tensor.detach().resolve_conj().resolve_neg().contiguous().to("cpu").reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()).toreadonly()


def _quantize(name: str, tensor: torch.Tensor, quantize: str | None) -> tuple[torch.Tensor, float | None]:
    """The tensor to send and its int8 scale; ``tensor`` itself when there is nothing to do."""
    if quantize is None or not tensor.is_floating_point():
        return tensor, None
    if quantize != "int8":
        return tensor.to(DTYPES[QUANT_DTYPES[quantize]]), None
    if tensor.numel() == 0:
        return tensor.to(torch.int8), 1.0
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"tensor {name!r}: cannot quantize NaN or Inf to int8")
    amax = float(tensor.abs().max())
    scale = max(amax / 127, math.ulp(0.0)) if amax > 0 else 1.0
    work = torch.float64 if tensor.dtype == torch.float64 or scale < _F32_TINY else torch.float32
    return torch.round(tensor.to(work) / scale).clamp_(-127, 127).to(torch.int8), scale


def _dequantize(raw: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    orig = DTYPES[spec.orig_dtype or spec.dtype]
    if spec.scale is None:
        return raw.to(orig)
    work = torch.float64 if orig == torch.float64 or spec.scale < _F32_TINY else torch.float32
    return (raw.to(work) * spec.scale).to(orig)


def encode_tensors(tensors: Mapping[str, torch.Tensor], *,
                   quantize: str | None = None) -> tuple[list[dict[str, Any]], list[memoryview]]:
    """Header entries (offsets contiguous from 0, in order) and the byte buffers to send, in order."""
    if quantize is not None and quantize not in QUANT_DTYPES:
        raise ValueError(f"quantize must be None or one of {sorted(QUANT_DTYPES)}, got {quantize!r}")
    entries: list[dict[str, Any]] = []
    buffers: list[memoryview] = []
    offset = 0
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensors must map str to torch.Tensor, got {type(name).__name__} -> {type(tensor).__name__}")
        orig_dtype = dtype_name(tensor.dtype, name)
        wire, scale = _quantize(name, tensor, quantize)
        data = tensor_bytes(wire)
        quant = quantize if wire.dtype != tensor.dtype else None
        spec = TensorSpec(name=name, dtype=dtype_name(wire.dtype, name), shape=tuple(wire.shape),
                          nbytes=data.nbytes, offset=offset, quant=quant, scale=scale,
                          orig_dtype=orig_dtype if quant else None)
        entries.append(spec.to_header())
        buffers.append(data)
        offset += data.nbytes
    return entries, buffers


def parse_entries(entries: object, *, limits: Limits = DEFAULT_LIMITS) -> list[TensorSpec]:
    """Validate a peer's list of entries: count cap, unique names, offsets contiguous from 0, total cap."""
    if not isinstance(entries, list):
        raise DecodeError(f"tensor entries must be a list, got {type(entries).__name__}")
    if len(entries) > limits.max_tensors:
        raise LimitExceeded(f"{len(entries)} tensor entries exceed max_tensors={limits.max_tensors}")
    specs: list[TensorSpec] = []
    names: set[str] = set()
    total = 0
    for index, entry in enumerate(entries):
        try:
            spec = TensorSpec.from_header(entry, limits=limits)
        except DecodeError as exc:
            raise type(exc)(f"entry #{index}: {exc}") from exc
        if spec.name in names:
            raise DecodeError(f"entry #{index}: tensor {show(spec.name)} appears twice")
        if spec.offset != total:
            raise DecodeError(f"tensor {show(spec.name)}: field 'offset'={spec.offset}, expected {total} (contiguous)")
        total += spec.nbytes
        if total > limits.max_payload_bytes:
            raise LimitExceeded(f"tensors total {total} bytes, over max_payload_bytes={limits.max_payload_bytes}")
        names.add(spec.name)
        specs.append(spec)
    return specs


def writable_buffer(payload: bytes | bytearray | memoryview) -> memoryview:
    """A writable, contiguous byte view of ``payload``; a read-only payload is copied once."""
    view = memoryview(payload)
    if view.readonly or not view.c_contiguous:
        return memoryview(bytearray(view))
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def byte_tensor(buffer: memoryview) -> torch.Tensor:
    """A uint8 tensor sharing the memory of a writable byte buffer (``frombuffer`` refuses empty ones)."""
    if buffer.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buffer, dtype=torch.uint8)


def view_tensor(whole: torch.Tensor, offset: int, nbytes: int, dtype: torch.dtype,
                shape: tuple[int, ...], where: str) -> torch.Tensor:
    """View ``whole[offset:offset+nbytes]`` as ``dtype`` and ``shape``; copies only misaligned bytes."""
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    piece = whole[offset:offset + nbytes]
    if piece.data_ptr() % dtype.itemsize or piece.storage_offset() % dtype.itemsize:
        piece = piece.clone()
    if dtype == torch.bool and bool((piece > 1).any()):
        raise DecodeError(f"{where}: bool bytes must be 0 or 1")
    return piece.view(dtype).view(shape)


def check_finite(tensor: torch.Tensor, where: str) -> None:
    """Raise NonFiniteTensor naming ``where`` if a floating tensor holds NaN or Inf."""
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise NonFiniteTensor(f"{where} holds NaN or Inf")


def decode_tensors(entries: object, payload: bytes | bytearray | memoryview, *,
                   limits: Limits = DEFAULT_LIMITS, require_finite: bool = False) -> dict[str, torch.Tensor]:
    """Tensors (CPU, declared shapes) from a peer's entries and payload; zero-copy where possible."""
    specs = parse_entries(entries, limits=limits)
    declared = sum(spec.nbytes for spec in specs)
    size = memoryview(payload).nbytes
    if size != declared:
        problem = "is truncated" if size < declared else f"has {size - declared} trailing bytes"
        raise DecodeError(f"payload of {size} bytes {problem}: the header declares {declared} bytes")
    whole = byte_tensor(writable_buffer(payload))
    tensors: dict[str, torch.Tensor] = {}
    for spec in specs:
        where = f"tensor {show(spec.name)}"
        tensor = view_tensor(whole, spec.offset, spec.nbytes, DTYPES[spec.dtype], spec.shape, where)
        if spec.quant is not None:
            tensor = _dequantize(tensor, spec)
        if require_finite:
            check_finite(tensor, where)
        tensors[spec.name] = tensor
    return tensors


def encode_tensor_message(tensors: Mapping[str, torch.Tensor], *,
                          quantize: str | None = None) -> tuple[bytes, list[memoryview]]:
    """Packed msgpack header ``{"tensors": entries}`` and the payload buffers to send after it."""
    entries, buffers = encode_tensors(tensors, quantize=quantize)
    return pack_header({"tensors": entries}), buffers


def decode_tensor_message(header_bytes: bytes | bytearray | memoryview, payload: bytes | bytearray | memoryview,
                          *, limits: Limits = DEFAULT_LIMITS,
                          require_finite: bool = False) -> dict[str, torch.Tensor]:
    """Inverse of ``encode_tensor_message``; the header must be exactly ``{"tensors": [...]}``."""
    header = unpack_header(header_bytes, limits=limits)
    if not isinstance(header, dict) or list(header) != ["tensors"]:
        raise DecodeError("tensor message header must be a map with exactly the key 'tensors'")
    return decode_tensors(header["tensors"], payload, limits=limits, require_finite=require_finite)
