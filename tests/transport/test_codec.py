"""transport.codec: exact round trips, zero copy, quantisation bounds, and strict refusal of bad peers."""

from __future__ import annotations

import math
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gossamer.transport.codec import (
    DTYPES,
    TensorSpec,
    decode_tensor_message,
    decode_tensors,
    encode_tensor_message,
    encode_tensors,
    tensor_bytes,
)
from gossamer.transport.errors import DecodeError, LimitExceeded, NonFiniteTensor
from gossamer.transport.header import pack_header
from gossamer.transport.limits import DEFAULT_LIMITS, Limits
from tests.transport.support import OUTCOMES, outcome

SHAPES = [(), (0,), (5,), (2, 3), (3, 0, 2), (2, 1, 2, 1)]
DELETE = object()


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -2**40), min(info.max, 2**40) + 1, shape, generator=gen).to(dtype)


def assert_same(expected: torch.Tensor, actual: torch.Tensor) -> None:
    assert (actual.dtype, actual.shape, actual.device.type) == (expected.dtype, expected.shape, "cpu")
    assert tensor_bytes(actual) == tensor_bytes(expected)


def joined(buffers: list[memoryview]) -> bytearray:
    return bytearray(b"".join(buffers))


def address(buffer: bytearray) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).ctypes.data


def round_trip(tensors: dict[str, torch.Tensor], **encode: Any) -> dict[str, torch.Tensor]:
    header, buffers = encode_tensor_message(tensors, **encode)
    return decode_tensor_message(header, joined(buffers))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_dtype_and_shape_round_trips(dtype: str, shape: tuple[int, ...]) -> None:
    tensors = {"t": sample(DTYPES[dtype], shape), "after": torch.arange(3)}

    decoded = round_trip(tensors)

    assert list(decoded) == ["t", "after"]
    for name, tensor in tensors.items():
        assert_same(tensor, decoded[name])


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12.0).reshape(3, 4).t(),
    lambda: torch.arange(20, dtype=torch.int32)[::3],
    lambda: torch.arange(24.0, dtype=torch.bfloat16).reshape(2, 3, 4).permute(2, 0, 1),
    lambda: torch.ones(4, 4, requires_grad=True) * 2,
    lambda: torch.tensor([1.0, -2.0])._neg_view(),
], ids=["transposed", "strided", "bf16-permuted", "requires-grad", "neg-view"])
def test_non_contiguous_input_round_trips(make: Any) -> None:
    tensor = make()

    decoded = round_trip({"x": tensor})

    assert torch.equal(decoded["x"], tensor.detach())


def test_encode_entries_are_contiguous_and_buffers_view_the_tensors() -> None:
    tensors = {"a": sample(torch.bfloat16, (3, 4)), "b": sample(torch.bool, (5,)), "c": sample(torch.int64, ())}

    entries, buffers = encode_tensors(tensors)

    assert [e["name"] for e in entries] == ["a", "b", "c"]
    assert [e["offset"] for e in entries] == [0, 24, 29]
    assert [len(b) for b in buffers] == [e["nbytes"] for e in entries] == [24, 5, 8]
    assert [TensorSpec.from_header(e, limits=DEFAULT_LIMITS).to_header() for e in entries] == entries
    assert all(b.readonly for b in buffers)
    assert [np.frombuffer(b, dtype=np.uint8).ctypes.data for b in buffers] == [t.data_ptr() for t in tensors.values()]


def test_decode_views_the_payload_without_copying() -> None:
    entries, buffers = encode_tensors({"a": sample(torch.float64, (3,)), "b": sample(torch.float32, (2, 2))})
    frame = bytearray(b"FRAMEHDR") + joined(buffers)  # a writable memoryview slice is viewed, not copied
    start = address(frame) + 8

    decoded = decode_tensors(entries, memoryview(frame)[8:])

    assert [t.data_ptr() for t in decoded.values()] == [start, start + 24]
    frame[32:36] = np.float32(7.0).tobytes()
    assert decoded["b"][0, 0].item() == 7.0


def test_read_only_bytes_payload_is_copied_once_and_writable() -> None:
    tensors = {"a": sample(torch.float32, (3,))}
    entries, buffers = encode_tensors(tensors)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it views a non-writable buffer
        decoded = decode_tensors(entries, b"".join(buffers))
    decoded["a"] += 1

    assert torch.equal(decoded["a"], tensors["a"] + 1)


def test_misaligned_tensor_is_decoded_correctly() -> None:
    tensors = {"flag": torch.tensor([True]), "w": sample(torch.float64, (3,)), "i": sample(torch.int16, (3,))}

    decoded = round_trip(tensors)

    for name, tensor in tensors.items():
        assert_same(tensor, decoded[name])
        assert decoded[name].data_ptr() % tensor.element_size() == 0


@pytest.mark.parametrize(("quantize", "relative", "wire"), [
    ("fp16", 2.0**-11, "float16"), ("bf16", 2.0**-8, "bfloat16")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_quantisation_error_is_half_an_ulp(quantize: str, relative: float, wire: str,
                                                 dtype: torch.dtype) -> None:
    tensor = sample(dtype, (1000,), seed=3)
    entries, _ = encode_tensors({"x": tensor}, quantize=quantize)

    decoded = round_trip({"x": tensor}, quantize=quantize)["x"]

    assert (entries[0]["dtype"], entries[0]["quant"], decoded.dtype) == (wire, quantize, dtype)
    assert bool(((decoded - tensor).abs() <= tensor.abs() * relative).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_int8_quantisation_error_is_half_a_step(dtype: torch.dtype) -> None:
    tensor = sample(dtype, (4, 250), seed=5)
    entries, buffers = encode_tensors({"x": tensor}, quantize="int8")
    amax = tensor.double().abs().max().item()

    decoded = decode_tensors(entries, joined(buffers))["x"]

    assert (entries[0]["dtype"], entries[0]["orig_dtype"], decoded.dtype) == ("int8", str(dtype)[6:], dtype)
    assert entries[0]["scale"] == pytest.approx(amax / 127)
    assert sum(len(b) for b in buffers) == tensor.numel()
    rounding = torch.finfo(dtype).eps * amax
    assert (decoded.double() - tensor.double()).abs().max().item() <= amax / 127 / 2 + rounding


@pytest.mark.parametrize(("tensor", "scale"), [
    (torch.zeros(3, 3), 1.0), (torch.zeros(0, 4), 1.0), (torch.tensor([1e-45, -1e-45]), float(torch.tensor(1e-45)) / 127)],
    ids=["zeros", "empty", "subnormal"])
def test_int8_edge_cases(tensor: torch.Tensor, scale: float) -> None:
    entries, buffers = encode_tensors({"x": tensor}, quantize="int8")

    decoded = decode_tensors(entries, joined(buffers))["x"]

    assert entries[0]["scale"] == scale
    assert torch.equal(decoded, tensor)


def test_quantisation_leaves_non_floating_and_already_narrow_tensors_alone() -> None:
    tensors = {"i": sample(torch.int32, (4,)), "b": sample(torch.bool, (4,)), "h": sample(torch.float16, (4,))}

    entries, _ = encode_tensors(tensors, quantize="fp16")
    decoded = round_trip(tensors, quantize="fp16")

    assert all("quant" not in entry for entry in entries)
    for name, tensor in tensors.items():
        assert_same(tensor, decoded[name])


@pytest.mark.parametrize(("tensors", "quantize", "error"), [
    ({"c": torch.zeros(2, dtype=torch.complex64)}, None, ValueError),
    ({"u": torch.zeros(2, dtype=torch.uint16)}, None, ValueError),
    ({"x": torch.zeros(2)}, "int4", ValueError),
    ({1: torch.zeros(2)}, None, TypeError),
    ({"x": [1.0]}, None, TypeError),
    *[({"x": torch.tensor([1.0, bad])}, "int8", ValueError) for bad in (math.nan, math.inf, -math.inf)],
], ids=["complex64", "uint16", "int4", "int-name", "list", "int8-nan", "int8-inf", "int8-minus-inf"])
def test_encode_refuses_local_mistakes(tensors: dict[Any, Any], quantize: str | None, error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_tensors(tensors, quantize=quantize)


def valid_message(quantize: str | None = None) -> tuple[list[dict[str, Any]], bytearray]:
    tensors = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "m": torch.tensor([True, False])}
    entries, buffers = encode_tensors(tensors, quantize=quantize)
    return entries, joined(buffers)


def patched(entry: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    entry = {**entry, **patch}
    return {key: value for key, value in entry.items() if value is not DELETE}


BAD_ENTRY = [  # (id, quantize, patch of the first entry "w", error, fragments of the message)
    ("dtype-object", None, {"dtype": "object"}, DecodeError, ["'dtype'", "'w'"]),
    ("dtype-complex64", None, {"dtype": "complex64"}, DecodeError, ["'dtype'"]),
    ("dtype-numpy-str", None, {"dtype": "<f4"}, DecodeError, ["'dtype'"]),
    ("dtype-int", None, {"dtype": 7}, DecodeError, ["'dtype'"]),
    ("dtype-list", None, {"dtype": ["float32"]}, DecodeError, ["'dtype'"]),
    ("dtype-vs-nbytes", None, {"dtype": "float64"}, DecodeError, ["'nbytes'", "'w'"]),
    ("nbytes-2**32-1", None, {"nbytes": 2**32 - 1}, DecodeError, ["'nbytes'"]),
    ("nbytes-2**63", None, {"nbytes": 2**63}, LimitExceeded, ["'nbytes'", "'w'"]),
    ("nbytes-negative", None, {"nbytes": -1}, DecodeError, ["'nbytes'"]),
    ("nbytes-float", None, {"nbytes": 24.0}, DecodeError, ["'nbytes'"]),
    ("nbytes-bool", None, {"nbytes": True}, DecodeError, ["'nbytes'"]),
    ("shape-negative", None, {"shape": [2, -3]}, DecodeError, ["'shape'", "'w'"]),
    ("shape-float", None, {"shape": [2.0, 3]}, DecodeError, ["'shape'"]),
    ("shape-bool", None, {"shape": [True, 6]}, DecodeError, ["'shape'"]),
    ("shape-str", None, {"shape": "2x3"}, DecodeError, ["'shape'"]),
    ("shape-mismatch", None, {"shape": [3, 3]}, DecodeError, ["'nbytes'"]),
    ("shape-ndim", None, {"shape": [1] * 9}, LimitExceeded, ["'shape'", "max_ndim"]),
    ("shape-huge", None, {"shape": [2**31, 2**31]}, LimitExceeded, ["'shape'"]),
    ("shape-huge-empty", None, {"shape": [0, 2**62], "nbytes": 0}, LimitExceeded, ["'shape'"]),
    ("huge-array", None, {"shape": [2**20] * 3, "nbytes": 4 * 2**60}, LimitExceeded, ["'nbytes'"]),
    ("offset-gap", None, {"offset": 1}, DecodeError, ["'offset'", "'w'"]),
    ("offset-str", None, {"offset": "0"}, DecodeError, ["'offset'"]),
    ("name-int", None, {"name": 5}, DecodeError, ["'name'"]),
    ("name-bytes", None, {"name": b"w"}, DecodeError, ["'name'"]),
    ("name-long", None, {"name": "x" * 513}, LimitExceeded, ["'name'", "max_name_bytes"]),
    ("name-surrogate", None, {"name": "\ud800"}, DecodeError, ["'name'"]),
    ("missing-shape", None, {"shape": DELETE}, DecodeError, ["'shape'", "'w'"]),
    ("unknown-field", None, {"pickle": b"x"}, DecodeError, ["'pickle'", "'w'"]),
    ("quant-unknown", None, {"quant": "int4", "orig_dtype": "float32"}, DecodeError, ["'quant'", "'w'"]),
    ("scale-without-quant", None, {"scale": 0.5}, DecodeError, ["'scale'"]),
    ("quant-dtype", None, {"quant": "int8", "scale": 1.0, "orig_dtype": "float32"}, DecodeError, ["'dtype'", "'w'"]),
    ("scale-negative", "int8", {"scale": -1.0}, DecodeError, ["'scale'", "'w'"]),
    ("scale-zero", "int8", {"scale": 0.0}, DecodeError, ["'scale'"]),
    ("scale-nan", "int8", {"scale": math.nan}, DecodeError, ["'scale'"]),
    ("scale-inf", "int8", {"scale": math.inf}, DecodeError, ["'scale'"]),
    ("scale-int", "int8", {"scale": 1}, DecodeError, ["'scale'"]),
    ("scale-missing", "int8", {"scale": DELETE}, DecodeError, ["'scale'"]),
    ("orig-int", "int8", {"orig_dtype": "int32"}, DecodeError, ["'orig_dtype'"]),
    ("orig-missing", "int8", {"orig_dtype": DELETE}, DecodeError, ["'orig_dtype'"]),
    ("orig-object", "int8", {"orig_dtype": "object"}, DecodeError, ["'orig_dtype'"]),
]


@pytest.mark.parametrize(("quantize", "patch", "error", "fragments"), [case[1:] for case in BAD_ENTRY],
                         ids=[case[0] for case in BAD_ENTRY])
def test_bad_entry_is_refused_with_a_typed_error(quantize: str | None, patch: dict[str, Any],
                                                  error: type[DecodeError], fragments: list[str]) -> None:
    entries, payload = valid_message(quantize)
    entries[0] = patched(entries[0], patch)

    with pytest.raises(error) as caught:
        decode_tensors(entries, payload)

    assert all(fragment in str(caught.value) for fragment in fragments), str(caught.value)


@pytest.mark.parametrize(("entries", "fragment"), [
    ({"w": 1}, "list"), (None, "list"), ([[1, 2]], "map"),
    ([{"name": "a", "dtype": "int8", "shape": [1], "nbytes": 1, "offset": 0}] * 2, "twice"),
], ids=["map", "none", "entry-list", "duplicate-name"])
def test_bad_entry_list_is_refused(entries: object, fragment: str) -> None:
    with pytest.raises(DecodeError, match=fragment):
        decode_tensors(entries, bytearray(2))


@pytest.mark.parametrize(("payload_change", "fragment"), [
    (lambda p: p[:-1], "truncated"), (lambda p: p[:0], "truncated"),
    (lambda p: p + b"\x00", "trailing"), (lambda p: p + pickle.dumps({"a": 1}), "trailing"),
    (lambda p: p[:-1] + b"\x02", "'m': bool bytes")],
    ids=["short-1", "empty", "garbage-1", "pickle", "bool-byte-2"])
def test_bad_payload_is_refused(payload_change: Any, fragment: str) -> None:
    entries, payload = valid_message()

    with pytest.raises(DecodeError, match=fragment):
        decode_tensors(entries, payload_change(payload))


@pytest.mark.parametrize(("limits", "fragment"), [
    (Limits(max_tensors=1), "max_tensors"), (Limits(max_payload_bytes=25), "max_payload_bytes"),
    (Limits(max_ndim=1), "max_ndim")])
def test_limits_are_applied(limits: Limits, fragment: str) -> None:
    entries, payload = valid_message()

    with pytest.raises(LimitExceeded, match=fragment):
        decode_tensors(entries, payload, limits=limits)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("quantize", [None, "fp16", "bf16"])
def test_require_finite_names_the_tensor(bad: float, quantize: str | None) -> None:
    header, buffers = encode_tensor_message({"ok": torch.ones(2), "bad": torch.tensor([0.0, bad])}, quantize=quantize)

    lenient = decode_tensor_message(header, joined(buffers))
    with pytest.raises(NonFiniteTensor, match="'bad'"):
        decode_tensor_message(header, joined(buffers), require_finite=True)

    assert not bool(torch.isfinite(lenient["bad"]).all())


def test_require_finite_catches_an_int8_scale_that_overflows() -> None:
    entries, payload = valid_message(quantize="int8")
    entries[0]["scale"] = 1e300

    with pytest.raises(NonFiniteTensor, match="'w'"):
        decode_tensors(entries, payload, require_finite=True)


@pytest.mark.parametrize(("header", "fragment"), [
    (pack_header([]), "'tensors'"),
    (pack_header({"tensors": [], "extra": 1}), "'tensors'"),
    (pack_header({}), "'tensors'"),
    (b"\x81\xa7tensors\xdd\xff\xff\xff\xff", "limit"),  # claims a 2**32-1 entry list
    (pack_header({"tensors": [[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]}), "depth"),
    (pickle.dumps({"tensors": []}), "trailing"),
], ids=["list", "extra-key", "no-key", "huge-list", "deep", "pickle"])
def test_bad_message_header_is_refused(header: bytes, fragment: str) -> None:
    with pytest.raises(DecodeError, match=fragment):
        decode_tensor_message(header, bytearray())


@st.composite
def tensor_dicts(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    names = draw(st.lists(st.text(max_size=6), max_size=4, unique=True))
    seed = draw(st.integers(0, 2**31))
    return {name: sample(DTYPES[draw(st.sampled_from(sorted(DTYPES)))],
                         tuple(draw(st.lists(st.integers(0, 4), max_size=3))), seed + i)
            for i, name in enumerate(names)}


@settings(max_examples=200, deadline=None)
@given(tensor_dicts())
def test_random_tensors_round_trip(tensors: dict[str, torch.Tensor]) -> None:
    decoded = round_trip(tensors)

    assert list(decoded) == list(tensors)
    for name, tensor in tensors.items():
        assert_same(tensor, decoded[name])


HEADER_VALUES = st.recursive(  # what a msgpack header can hold
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8) | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1), st.sampled_from(["name", "dtype", "shape", "nbytes", "offset", "quant", "scale",
                                           "orig_dtype", "other"]), HEADER_VALUES, st.booleans())
def test_mutated_entries_raise_only_decode_errors(index: int, key: str, value: object, int8: bool) -> None:
    entries, payload = valid_message(quantize="int8" if int8 else None)
    entries[index][key] = value

    assert outcome(lambda: decode_tensors(entries, payload, require_finite=True)) in OUTCOMES


@settings(max_examples=200, deadline=None)
@given(HEADER_VALUES, st.binary(max_size=64), st.binary(max_size=32))
def test_arbitrary_entries_and_bytes_raise_only_decode_errors(entries: object, header: bytes, payload: bytes) -> None:
    for decode in (lambda: decode_tensors(entries, payload), lambda: decode_tensors([entries], payload),
                   lambda: decode_tensor_message(header, payload)):
        assert outcome(decode) in OUTCOMES


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255), st.sampled_from(["flip-header", "flip-payload",
                                                                     "cut-header", "cut-payload"]))
def test_mutated_messages_raise_only_decode_errors(position: int, value: int, mutation: str) -> None:
    header, buffers = encode_tensor_message({"w": sample(torch.float32, (2, 3)), "m": torch.tensor([True]),
                                             "q": sample(torch.float64, (4,))}, quantize="int8")
    parts = {"header": bytearray(header), "payload": joined(buffers)}
    target = parts[mutation.split("-")[1]]
    position %= len(target)
    if mutation.startswith("flip"):
        target[position] ^= value or 1
    else:
        del target[position:]

    assert outcome(lambda: decode_tensor_message(bytes(parts["header"]), parts["payload"])) in OUTCOMES

