"""transport.safetensors_stream: library-compatible bodies both ways, strict parsing, atomic checkpoints."""

from __future__ import annotations

import json
import math
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from gossamer.transport.codec import DTYPES, tensor_bytes
from gossamer.transport.errors import DecodeError, LimitExceeded, NonFiniteTensor
from gossamer.transport.limits import Limits
from gossamer.transport.safetensors_stream import (
    decode_safetensors,
    encode_safetensors,
    load_file,
    safetensors_header_length,
    save_file_atomic,
)
from tests.transport.support import OUTCOMES, outcome

SHAPES = [(), (0,), (5,), (2, 3), (3, 0, 2)]


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -2**40), min(info.max, 2**40) + 1, shape, generator=gen).to(dtype)


def assert_same(expected: torch.Tensor, actual: torch.Tensor) -> None:
    assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
    assert tensor_bytes(actual) == tensor_bytes(expected)


def body_of(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> bytearray:
    total, chunks = encode_safetensors(tensors, metadata)
    body = bytearray(b"".join(chunks))
    assert len(body) == total
    return body


def raw_body(header: object, data: bytes = b"", *, pad: bool = True) -> bytearray:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    if pad:
        text += b" " * (-len(text) % 8)
    return bytearray(struct.pack("<Q", len(text)) + text + data)


def nested(depth: int) -> object:
    obj: object = "x"
    for _ in range(depth):
        obj = [obj]
    return obj


def mixed() -> dict[str, torch.Tensor]:
    return {"w": sample(torch.float32, (2, 3)), "flag": torch.tensor([True, False, True]),
            "step": torch.tensor(7, dtype=torch.int64), "empty": torch.zeros(0, 4, dtype=torch.bfloat16),
            "half": sample(torch.float16, (5,)), "t": torch.arange(12.0, dtype=torch.float64).reshape(3, 4).t()}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_dtype_and_shape_round_trips(dtype: str, shape: tuple[int, ...]) -> None:
    tensors = {"t": sample(DTYPES[dtype], shape), "b": torch.tensor([True])}

    decoded, metadata = decode_safetensors(body_of(tensors))

    assert metadata == {}
    for name, tensor in tensors.items():
        assert_same(tensor, decoded[name])


def test_layout_has_padded_header_and_aligned_zero_copy_tensors() -> None:
    body = body_of(mixed(), {"round": "3"})
    start = np.frombuffer(body, dtype=np.uint8).ctypes.data

    header_bytes = safetensors_header_length(body[:8])
    decoded, metadata = decode_safetensors(body)

    assert header_bytes % 8 == 0 and body[8 + header_bytes - 1:8 + header_bytes] in (b" ", b"}")
    assert metadata == {"round": "3"}
    for tensor in decoded.values():
        if tensor.numel():
            assert start + 8 + header_bytes <= tensor.data_ptr() < start + len(body)
            assert tensor.data_ptr() % tensor.element_size() == 0


def test_chunks_view_contiguous_tensors_without_copying() -> None:
    tensor = sample(torch.float32, (64,))

    _, chunks = encode_safetensors({"w": tensor})

    assert np.frombuffer(chunks[-1], dtype=np.uint8).ctypes.data == tensor.data_ptr()


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt", "note": "ünï"}])
def test_library_reads_ours(metadata: dict[str, str] | None, tmp_path: Path) -> None:
    tensors = mixed()
    path = tmp_path / "ours.safetensors"
    path.write_bytes(body_of(tensors, metadata))

    loaded = safetensors.torch.load(path.read_bytes())
    with safe_open(str(path), "pt") as handle:
        their_metadata = handle.metadata()

    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert_same(tensor, loaded[name])
    assert (their_metadata or {}) == (metadata or {})


@pytest.mark.parametrize("metadata", [None, {"format": "pt", "k": "v"}])
def test_we_read_the_library(metadata: dict[str, str] | None, tmp_path: Path) -> None:
    tensors = {name: tensor.contiguous() for name, tensor in mixed().items()}
    path = tmp_path / "theirs.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)

    from_bytes, metadata_bytes = decode_safetensors(safetensors.torch.save(tensors, metadata=metadata))
    from_file, metadata_file = load_file(path)

    assert metadata_bytes == metadata_file == (metadata or {})
    for name, tensor in tensors.items():
        assert_same(tensor, from_bytes[name])
        assert_same(tensor, from_file[name])


@pytest.mark.parametrize("prefix", [b"", b"\x10\x00", struct.pack("<Q", 2**63), struct.pack("<Q", 2**32 - 1),
                                    struct.pack("<Q", 1)],
                         ids=["empty", "short", "2**63", "2**32-1", "one"])
def test_header_length_prefix_is_checked(prefix: bytes) -> None:
    expected = LimitExceeded if len(prefix) == 8 and prefix != struct.pack("<Q", 1) else DecodeError

    with pytest.raises(expected):
        safetensors_header_length(prefix)


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BAD_BODIES = [  # (id, body, error, fragment of the message)
    ("truncated-header", raw_body({"w": F32}, b"\x00" * 8)[:20], DecodeError, "truncated"),
    ("truncated-data", raw_body({"w": F32}, b"\x00" * 7), DecodeError, "truncated"),
    ("trailing-garbage", raw_body({"w": F32}, b"\x00" * 9), DecodeError, "trailing"),
    ("not-json", raw_body(b"{nope"), DecodeError, "JSON"),
    ("not-utf8", raw_body(b'{"\xff":1}'), DecodeError, "UTF-8"),
    ("json-array", raw_body([1, 2]), DecodeError, "object"),
    ("json-nan", raw_body(b'{"w": NaN}'), DecodeError, "NaN"),
    ("duplicate-key", raw_body(b'{"w": 1, "w": 2}'), DecodeError, "duplicate"),
    ("deep-nesting", raw_body(b"[" * 50_000 + b"]" * 50_000), LimitExceeded, "nests"),
    ("deep-metadata", raw_body({"__metadata__": {"a": nested(20)}}), LimitExceeded, "depth"),
    ("dtype-object", raw_body({"w": {**F32, "dtype": "object"}}, b"\x00" * 8), DecodeError, "'dtype'"),
    ("dtype-fp8", raw_body({"w": {**F32, "dtype": "F8_E4M3"}}, b"\x00" * 8), DecodeError, "'dtype'"),
    ("dtype-lower", raw_body({"w": {**F32, "dtype": "f32"}}, b"\x00" * 8), DecodeError, "'dtype'"),
    ("dtype-int", raw_body({"w": {**F32, "dtype": 4}}, b"\x00" * 8), DecodeError, "'dtype'"),
    ("shape-negative", raw_body({"w": {**F32, "shape": [-2]}}, b"\x00" * 8), DecodeError, "'shape'"),
    ("shape-float", raw_body({"w": {**F32, "shape": [2.0]}}, b"\x00" * 8), DecodeError, "'shape'"),
    ("shape-bool", raw_body({"w": {**F32, "shape": [True, 2]}}, b"\x00" * 8), DecodeError, "'shape'"),
    ("shape-str", raw_body({"w": {**F32, "shape": "2"}}, b"\x00" * 8), DecodeError, "'shape'"),
    ("shape-ndim", raw_body({"w": {**F32, "shape": [1] * 9}}, b"\x00" * 8), LimitExceeded, "max_ndim"),
    ("shape-huge", raw_body({"w": {**F32, "shape": [2**40, 2**40], "data_offsets": [0, 2**82]}}),
     LimitExceeded, "'shape'"),
    ("shape-mismatch", raw_body({"w": {**F32, "shape": [3]}}, b"\x00" * 8), DecodeError, "'data_offsets'"),
    ("offsets-len", raw_body({"w": {**F32, "data_offsets": [0, 8, 8]}}, b"\x00" * 8), DecodeError, "'data_offsets'"),
    ("offsets-negative", raw_body({"w": {**F32, "data_offsets": [-8, 0]}}), DecodeError, "'data_offsets'"),
    ("offsets-float", raw_body({"w": {**F32, "data_offsets": [0.0, 8.0]}}, b"\x00" * 8), DecodeError,
     "'data_offsets'"),
    ("offsets-reversed", raw_body({"w": {**F32, "data_offsets": [8, 0]}}, b"\x00" * 8), DecodeError, "'data_offsets'"),
    ("offsets-gap", raw_body({"w": {**F32, "data_offsets": [4, 12]}}, b"\x00" * 12), DecodeError, "gap"),
    ("offsets-overlap", raw_body({"a": F32, "b": {**F32, "data_offsets": [4, 12]}}, b"\x00" * 12),
     DecodeError, "overlaps"),
    ("offsets-2**64", raw_body({"w": {**F32, "data_offsets": [2**64 - 8, 2**64]}}, b"\x00" * 8), DecodeError,
     "gap"),
    ("entry-extra-key", raw_body({"w": {**F32, "pickle": "x"}}, b"\x00" * 8), DecodeError, "keys"),
    ("entry-missing-key", raw_body({"w": {"dtype": "F32", "shape": [2]}}, b"\x00" * 8), DecodeError, "keys"),
    ("entry-not-object", raw_body({"w": [1]}), DecodeError, "keys"),
    ("metadata-int", raw_body({"__metadata__": {"a": 1}}), DecodeError, "__metadata__"),
    ("metadata-list", raw_body({"__metadata__": ["a"]}), DecodeError, "__metadata__"),
    ("name-long", raw_body({"x" * 513: F32}, b"\x00" * 8), LimitExceeded, "max_name_bytes"),
    ("name-surrogate", raw_body(b'{"\\ud800": {"dtype": "U8", "shape": [], "data_offsets": [0, 1]}}', b"\x01"),
     DecodeError, "UTF-8"),
    ("bool-byte-2", raw_body({"b": {"dtype": "BOOL", "shape": [1], "data_offsets": [0, 1]}}, b"\x02"),
     DecodeError, "bool"),
    ("pickle", bytearray(pickle.dumps({"w": [1.0, 2.0]})), DecodeError, "header"),
]


@pytest.mark.parametrize(("body", "error", "fragment"), [case[1:] for case in BAD_BODIES],
                         ids=[case[0] for case in BAD_BODIES])
def test_bad_body_is_refused_with_a_typed_error(body: bytearray, error: type[DecodeError], fragment: str) -> None:
    with pytest.raises(error) as caught:
        decode_safetensors(bytes(body))

    assert fragment in str(caught.value)


@pytest.mark.parametrize(("limits", "fragment"), [
    (Limits(max_tensors=2), "max_tensors"), (Limits(max_header_bytes=64), "max_header_bytes"),
    (Limits(max_payload_bytes=16), "max_payload_bytes"), (Limits(max_ndim=1), "max_ndim")])
def test_limits_are_applied(limits: Limits, fragment: str) -> None:
    body = body_of(mixed())

    with pytest.raises(LimitExceeded, match=fragment):
        decode_safetensors(body, limits=limits)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_require_finite_names_the_tensor(bad: float) -> None:
    body = body_of({"ok": torch.ones(2), "bad": torch.tensor([1.0, bad], dtype=torch.bfloat16)})

    lenient, _ = decode_safetensors(body)
    with pytest.raises(NonFiniteTensor, match="'bad'"):
        decode_safetensors(body, require_finite=True)

    assert not bool(torch.isfinite(lenient["bad"]).all())


@pytest.mark.parametrize(("tensors", "metadata", "error"), [
    ({"__metadata__": torch.zeros(1)}, None, TypeError),
    ({"c": torch.zeros(1, dtype=torch.complex64)}, None, ValueError),
    ({"w": torch.zeros(1)}, {"k": 1}, TypeError),
], ids=["reserved-name", "complex64", "metadata-int"])
def test_encode_refuses_local_mistakes(tensors: dict[str, torch.Tensor], metadata: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_safetensors(tensors, metadata)


def test_save_replaces_and_loads_back(tmp_path: Path) -> None:
    path = tmp_path / "ck.safetensors"
    save_file_atomic({"w": torch.zeros(3)}, path)

    save_file_atomic(mixed(), path, {"round": "2"})
    tensors, metadata = load_file(path)

    assert metadata == {"round": "2"}
    for name, tensor in mixed().items():
        assert_same(tensor, tensors[name])
    assert os.listdir(tmp_path) == ["ck.safetensors"]


@pytest.mark.parametrize("bad", [
    {"a": torch.ones(1000), "z_meta": torch.empty(10, device="meta")},  # fails after "a" is written
    {"a": torch.ones(3), "c": torch.zeros(2, dtype=torch.complex64)},  # fails before writing
], ids=["halfway", "before"])
def test_failed_save_leaves_the_old_file_intact(bad: dict[str, torch.Tensor], tmp_path: Path) -> None:
    path = tmp_path / "ck.safetensors"
    save_file_atomic({"old": torch.arange(4)}, path, {"v": "1"})
    before = path.read_bytes()

    with pytest.raises((NotImplementedError, ValueError)):
        save_file_atomic(bad, path)

    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ck.safetensors"]


def test_save_into_a_missing_directory_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        save_file_atomic({"w": torch.ones(1)}, tmp_path / "missing" / "ck.safetensors")


def test_load_file_refuses_a_truncated_or_oversized_file(tmp_path: Path) -> None:
    path = tmp_path / "ck.safetensors"
    save_file_atomic(mixed(), path)
    path.write_bytes(path.read_bytes()[:-3])

    with pytest.raises(DecodeError, match="truncated"):
        load_file(path)
    with pytest.raises(LimitExceeded):
        load_file(path, limits=Limits(max_header_bytes=8, max_payload_bytes=8))


@st.composite
def tensor_dicts(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    names = draw(st.lists(st.text(min_size=1, max_size=6).filter(lambda n: n != "__metadata__"),
                          max_size=4, unique=True))
    seed = draw(st.integers(0, 2**31))
    return {name: sample(DTYPES[draw(st.sampled_from(sorted(DTYPES)))],
                         tuple(draw(st.lists(st.integers(0, 4), max_size=3))), seed + i)
            for i, name in enumerate(names)}


@settings(max_examples=200, deadline=None)
@given(tensor_dicts(), st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2))
def test_random_tensors_round_trip_through_ours_and_the_library(tensors: dict[str, torch.Tensor],
                                                                 metadata: dict[str, str]) -> None:
    body = body_of(tensors, metadata)

    ours, our_metadata = decode_safetensors(body)
    theirs = safetensors.torch.load(bytes(body))
    back, _ = decode_safetensors(safetensors.torch.save(tensors))

    assert our_metadata == metadata
    for name, tensor in tensors.items():
        assert_same(tensor, ours[name])
        assert_same(tensor, theirs[name])
        assert_same(tensor, back[name])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=128))
def test_random_bytes_raise_only_decode_errors(data: bytes) -> None:
    assert outcome(lambda: decode_safetensors(data)) in OUTCOMES
    assert outcome(lambda: decode_safetensors(struct.pack("<Q", len(data)) + data)) in OUTCOMES


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 255), st.booleans())
def test_mutated_bodies_raise_only_decode_errors(position: int, flip: int, truncate: bool) -> None:
    body = body_of({"w": sample(torch.float32, (2, 3)), "m": torch.tensor([True]), "s": torch.tensor(3)},
                   {"k": "v"})
    position %= len(body)
    if truncate:
        del body[position:]
    else:
        body[position] ^= flip

    assert outcome(lambda: decode_safetensors(body, require_finite=True)) in OUTCOMES


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["w", "m", "__metadata__"]), st.sampled_from(["dtype", "shape", "data_offsets", "k", "x"]),
       JSON_VALUES)
def test_mutated_header_fields_raise_only_decode_errors(name: str, key: str, value: object) -> None:
    header = {"__metadata__": {"k": "v"}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "m": {"dtype": "BOOL", "shape": [], "data_offsets": [8, 9]}}
    header[name][key] = value

    assert outcome(lambda: decode_safetensors(raw_body(header, bytes(range(9))), require_finite=True)) in OUTCOMES
