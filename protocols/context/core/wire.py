"""Coefficient messages (``kv`` forward, ``dkv`` backward): ``KVMessage``, its frame (a header map
and a raw little-endian payload, ``encode_message``), every check on arrival (``decode_message``:
a refused message changes nothing), routing (``forward_to``), a step's message plan, byte counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gossamer.protocols.context.core.errors import BasisMismatch, MessageRefused

WIRE_VERSION = 1
FORWARD, BACKWARD = "kv", "dkv"
KINDS = (FORWARD, BACKWARD)
WIRE_DTYPES: Mapping[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                                          "float32": torch.float32, "float64": torch.float64}
DTYPE_NAMES = {dtype: name for name, dtype in WIRE_DTYPES.items()}
HEADER_KEYS = frozenset({"v", "kind", "step", "layer", "owner", "user", "basis", "dtype", "shape", "mixtures"})
INDEX_DTYPE = torch.uint8


@dataclass(frozen=True)
class KVMessage:
    """One coefficient message: ``kv`` (chunk ``owner``'s keys and values, ``user`` None) or ``dkv``
    (their gradient from member ``user``). ``k``/``v`` are [batch, heads, tokens, width];
    ``index`` is [batch, heads, tokens] uint8 on a ``kv`` message with mixtures > 1, else None."""

    kind: str
    step: int
    layer: int
    owner: int
    user: int | None
    basis: str
    k: Tensor
    v: Tensor
    index: Tensor | None = None

    @property
    def key(self) -> tuple[str, int, int, int | None]:
        """What identifies it within a step: (kind, layer, owner, user)."""
        return self.kind, self.layer, self.owner, self.user

    def to(self, device: torch.device) -> KVMessage:
        """The same message with its tensors on ``device``."""
        if self.k.device == device:
            return self
        index = None if self.index is None else self.index.to(device)
        return KVMessage(self.kind, self.step, self.layer, self.owner, self.user, self.basis,
                         self.k.to(device), self.v.to(device), index)


@dataclass(frozen=True, kw_only=True)
class MessageSpec:
    """Everything a member expects of the messages of one step (built by ``RingMember``)."""

    step: int
    chunks: int
    layers: int
    batch: int
    tokens: int
    heads: int
    width: int
    mixtures: int
    dtype: torch.dtype
    bases: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.batch, self.heads, self.tokens, self.width

    def has_index(self, kind: str) -> bool:
        return kind == FORWARD and self.mixtures > 1


# --- encoding ---------------------------------------------------------------------------------


def _bytes_of(tensor: Tensor) -> Any:
    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()


def encode_message(message: KVMessage, *, mixtures: int) -> tuple[dict[str, Any], list[Any]]:
    """(header, payload buffers): the frame a transport sends. ``mixtures`` is the sender's M."""
    dtype = DTYPE_NAMES.get(message.k.dtype)
    if dtype is None:
        raise MessageRefused(f"dtype: {message.k.dtype} cannot go on the wire", code="dtype")
    header = {"v": WIRE_VERSION, "kind": message.kind, "step": message.step, "layer": message.layer,
              "owner": message.owner, "user": message.user, "basis": message.basis, "dtype": dtype,
              "shape": list(message.k.shape), "mixtures": mixtures}
    payload = [_bytes_of(message.k), _bytes_of(message.v)]
    if message.index is not None:
        payload.append(_bytes_of(message.index.to(INDEX_DTYPE)))
    return header, payload


def payload_bytes(spec: MessageSpec, kind: str) -> int:
    """Exact payload length of a ``kind`` message under ``spec``."""
    numbers = 2 * math.prod(spec.shape) * torch.empty((), dtype=spec.dtype).element_size()
    return numbers + (math.prod(spec.shape[:3]) if spec.has_index(kind) else 0)


# --- decoding and checks ----------------------------------------------------------------------


def _int_field(header: Mapping[str, Any], name: str) -> int:
    value = header[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise MessageRefused(f"header: {name} must be an integer, got {type(value).__name__}", code="header")
    return value


def _check_header(header: Mapping[str, Any], spec: MessageSpec) -> None:
    if not isinstance(header, Mapping) or set(header) != HEADER_KEYS:
        keys = sorted(map(str, header)) if isinstance(header, Mapping) else type(header).__name__
        raise MessageRefused(f"header: expected keys {sorted(HEADER_KEYS)}, got {keys}", code="header")
    if header["v"] != WIRE_VERSION:
        raise MessageRefused(f"header: wire version {header['v']!r}, this member speaks {WIRE_VERSION}", code="header")
    if header["kind"] not in KINDS:
        raise MessageRefused(f"header: kind must be one of {KINDS}, got {header['kind']!r}", code="header")
    for name in ("step", "layer", "owner", "mixtures"):
        _int_field(header, name)
    if header["kind"] == BACKWARD:
        _int_field(header, "user")
    elif header["user"] is not None:
        raise MessageRefused("header: a kv message names no user", code="header")
    if not isinstance(header["basis"], str):
        raise MessageRefused("header: basis must be a hex string", code="header")
    shape = header["shape"]
    if not isinstance(shape, list | tuple) or len(shape) != 4 or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in shape):
        raise MessageRefused(f"header: shape must be 4 integers, got {shape!r}", code="header")
    if header["dtype"] not in WIRE_DTYPES:
        raise MessageRefused(f"dtype: {header['dtype']!r} is not one of {sorted(WIRE_DTYPES)}", code="dtype")


def decode_message(header: Mapping[str, Any], payload: Any, spec: MessageSpec) -> KVMessage:
    """A checked ``KVMessage`` from a received frame; ``MessageRefused`` for anything unexpected.

    The tensors view ``payload`` when it is writable (no copy); a read-only payload is copied once.
    """
    _check_header(header, spec)
    kind = header["kind"]
    dtype = WIRE_DTYPES[header["dtype"]]
    if dtype != spec.dtype:
        raise MessageRefused(f"dtype: {header['dtype']}, this ring uses {DTYPE_NAMES[spec.dtype]}", code="dtype")
    if tuple(header["shape"]) != spec.shape or header["mixtures"] != spec.mixtures:
        raise MessageRefused(f"shape: {header['shape']} with {header['mixtures']} subspaces, expected "
                             f"{list(spec.shape)} with {spec.mixtures}", code="shape")
    view = memoryview(payload).cast("B")
    expected = payload_bytes(spec, kind)
    if view.nbytes != expected:
        raise MessageRefused(f"length: payload is {view.nbytes} bytes, a {kind} message here has {expected}",
                             code="length")
    if view.readonly:
        view = memoryview(bytearray(view))
    count = math.prod(spec.shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    k = torch.frombuffer(view, dtype=dtype, count=count, offset=0).view(spec.shape)
    v = torch.frombuffer(view, dtype=dtype, count=count, offset=count * itemsize).view(spec.shape)
    index = None
    if spec.has_index(kind):
        index = torch.frombuffer(view, dtype=INDEX_DTYPE, count=count // spec.width,
                                 offset=2 * count * itemsize).view(spec.shape[:3])
    message = KVMessage(kind, header["step"], header["layer"], header["owner"], header["user"], header["basis"],
                        k, v, index)
    check_message(message, spec)
    return message


def check_message(message: KVMessage, spec: MessageSpec) -> None:
    """``MessageRefused`` unless ``message`` fits ``spec`` in every respect: kind, step, layer, owner
    and user in range, dtype, shape, width, mixtures, finite values, index range, basis hash."""
    if message.kind not in KINDS:
        raise MessageRefused(f"kind: must be one of {KINDS}, got {message.kind!r}", code="header")
    if message.step != spec.step:
        raise MessageRefused(f"order: message of step {message.step}, this member is at step {spec.step}",
                             code="order")
    if not 0 <= message.layer < spec.layers:
        raise MessageRefused(f"header: layer {message.layer} outside [0, {spec.layers})", code="header")
    for name, value in (("owner", message.owner), ("user", message.user)):
        if value is not None and not 0 <= value < spec.chunks:
            raise MessageRefused(f"header: {name} {value} outside [0, {spec.chunks})", code="header")
    if message.basis != spec.bases[message.layer]:
        raise BasisMismatch(f"basis: layer {message.layer} was coded with bases {message.basis[:16]}..., "
                            f"ours are {spec.bases[message.layer][:16]}...")
    for name, tensor in (("k", message.k), ("v", message.v)):
        if tuple(tensor.shape) != spec.shape:
            raise MessageRefused(f"shape: {name} is {tuple(tensor.shape)}, expected {spec.shape}", code="shape")
        if tensor.dtype != spec.dtype:
            raise MessageRefused(f"dtype: {name} is {tensor.dtype}, expected {spec.dtype}", code="dtype")
        if not bool(torch.isfinite(tensor).all()):
            raise MessageRefused(f"nonfinite: {name} holds NaN or Inf", code="nonfinite")
    _check_index(message, spec)


def _check_index(message: KVMessage, spec: MessageSpec) -> None:
    index = message.index
    if not spec.has_index(message.kind):
        if index is not None:
            raise MessageRefused("index: this message carries no subspace index", code="index")
        return
    if index is None or tuple(index.shape) != spec.shape[:3] or index.dtype != INDEX_DTYPE:
        got = None if index is None else (tuple(index.shape), index.dtype)
        raise MessageRefused(f"index: expected {spec.shape[:3]} {INDEX_DTYPE}, got {got}", code="index")
    if index.numel() and int(index.max()) >= spec.mixtures:
        raise MessageRefused(f"index: {int(index.max())} is not one of {spec.mixtures} subspaces", code="index")


# --- routing and the step's plan --------------------------------------------------------------


def forward_to(member: int, chunks: int) -> int | None:
    """Where ``member`` passes a kv message it sent or received: its ring successor, while there is
    one (causal: the last member needs every earlier chunk and passes nothing on)."""
    return member + 1 if member + 1 < chunks else None


@dataclass(frozen=True)
class PlannedSend:
    """One message of a step: sent by ``source`` to ``target`` once every ``after`` is delivered.

    Keys are (member it was delivered to, kind, layer, owner, user)."""

    source: int
    target: int
    key: tuple[str, int, int, int | None]
    after: tuple[tuple[int, str, int, int, int | None], ...]


def message_plan(chunks: int, layers: int) -> list[PlannedSend]:
    """Every message one training step sends, and what each must wait for (the ring's dependencies,
    without compute): the order ``RingMember`` follows, for replaying a step's traffic."""
    plan: list[PlannedSend] = []
    for layer in range(layers):
        for owner in range(chunks - 1):
            after = tuple((owner, FORWARD, layer - 1, i, None) for i in range(owner)) if layer else ()
            plan.append(PlannedSend(owner, owner + 1, (FORWARD, layer, owner, None), after))
            for hop in range(owner + 1, chunks - 1):
                plan.append(PlannedSend(hop, hop + 1, (FORWARD, layer, owner, None),
                                        ((hop, FORWARD, layer, owner, None),)))
    for layer in reversed(range(layers)):
        for user in range(1, chunks):
            after = tuple((user, FORWARD, lay, i, None) for lay in range(layers) for i in range(user))
            if layer < layers - 1:
                after += tuple((user, BACKWARD, layer + 1, user, u) for u in range(user + 1, chunks))
            plan.extend(PlannedSend(user, owner, (BACKWARD, layer, owner, user), after) for owner in range(user))
    return plan


def sequence_payload_bytes(spec: MessageSpec) -> dict[str, int]:
    """Payload bytes one step moves over all links, by kind: P(P-1)/2 messages of each kind per layer."""
    per_layer = spec.chunks * (spec.chunks - 1) // 2
    return {kind: per_layer * spec.layers * payload_bytes(spec, kind) for kind in KINDS}
