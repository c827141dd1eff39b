"""The TCP frame codec: prefix checks, whole-frame round trips, and fuzzing with Hypothesis."""

from __future__ import annotations

import pickle
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossamer.transport.errors import DecodeError, LimitExceeded
from gossamer.transport.frames import (
    MAGIC,
    PREFIX,
    PREFIX_BYTES,
    VERSION,
    Frame,
    FrameType,
    decode_frame,
    encode_frame,
    encode_prefix,
    parse_prefix,
)
from gossamer.transport.header import pack_header
from gossamer.transport.limits import Limits
from tests.transport.support import OUTCOMES, outcome

SMALL = Limits(max_header_bytes=4096, max_payload_bytes=1 << 16)

header_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
frames = st.builds(
    Frame,
    st.sampled_from(FrameType),
    st.dictionaries(st.text(max_size=12), header_values, max_size=6),
    st.lists(st.binary(max_size=300), max_size=4),
)


def wire(frame: Frame) -> bytes:
    return b"".join(bytes(part) for part in encode_frame(frame))


def raw_frame(*, magic=MAGIC, version=VERSION, type_code=1, header=b"\x80", payload=b"",
              header_len=None, payload_len=None) -> bytes:
    prefix = PREFIX.pack(magic, version, type_code, len(header) if header_len is None else header_len,
                         len(payload) if payload_len is None else payload_len)
    return prefix + header + payload


# --- prefix ---------------------------------------------------------------------------------


def test_prefix_round_trip() -> None:
    prefix = encode_prefix(FrameType.ONEWAY, 12, 3456)

    parsed = parse_prefix(prefix, limits=SMALL)

    assert len(prefix) == PREFIX_BYTES == 18
    assert parsed == (FrameType.ONEWAY, 12, 3456)


@pytest.mark.parametrize(
    ("prefix", "error", "field"),
    [
        (PREFIX.pack(b"GSMX", 1, 1, 0, 0), DecodeError, "magic"),
        (PREFIX.pack(MAGIC, 2, 1, 0, 0), DecodeError, "version"),
        (PREFIX.pack(MAGIC, 1, 0, 0, 0), DecodeError, "type"),
        (PREFIX.pack(MAGIC, 1, 9, 0, 0), DecodeError, "type"),
        (PREFIX.pack(MAGIC, 1, 1, 2**32 - 1, 0), LimitExceeded, "header_len"),
        (PREFIX.pack(MAGIC, 1, 1, 4097, 0), LimitExceeded, "header_len"),
        (PREFIX.pack(MAGIC, 1, 1, 0, 2**64 - 1), LimitExceeded, "payload_len"),
        (PREFIX.pack(MAGIC, 1, 1, 0, (1 << 16) + 1), LimitExceeded, "payload_len"),
        (PREFIX.pack(MAGIC, 1, 1, 0, 0)[:-1], DecodeError, "prefix"),
    ],
)
def test_bad_prefix_is_refused_naming_the_field(prefix: bytes, error: type[Exception], field: str) -> None:
    with pytest.raises(error, match=field):
        parse_prefix(prefix, limits=SMALL)


def test_prefix_at_the_caps_is_accepted() -> None:
    prefix = PREFIX.pack(MAGIC, 1, 2, 4096, 1 << 16)

    assert parse_prefix(prefix, limits=SMALL) == (FrameType.RESPONSE, 4096, 1 << 16)


def test_encode_prefix_refuses_lengths_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="header_len"):
        encode_prefix(FrameType.REQUEST, 2**32, 0)
    with pytest.raises(ValueError, match="payload_len"):
        encode_prefix(FrameType.REQUEST, 0, -1)


# --- whole frames ---------------------------------------------------------------------------


def test_frame_round_trip_with_scattered_payload() -> None:
    frame = Frame(FrameType.REQUEST, {"rid": 7, "name": "x"}, [b"abc", bytearray(b"de"), memoryview(b"f")])

    decoded = decode_frame(wire(frame))

    assert decoded.type is FrameType.REQUEST
    assert decoded.header == {"rid": 7, "name": "x"}
    assert bytes(decoded.payload) == b"abcdef"


def test_encode_frame_does_not_copy_the_payload() -> None:
    payload = bytearray(1000)

    parts = encode_frame(Frame(FrameType.ONEWAY, {}, payload))

    assert len(parts) == 2
    assert isinstance(parts[1], memoryview) and parts[1].obj is payload


def test_truncated_frame_is_refused() -> None:
    data = wire(Frame(FrameType.REQUEST, {"a": 1}, b"payload"))

    for cut in (0, 5, PREFIX_BYTES, len(data) - 1):
        with pytest.raises(DecodeError, match="truncated"):
            decode_frame(data[:cut])


def test_trailing_bytes_are_refused() -> None:
    data = wire(Frame(FrameType.REQUEST, {"a": 1}, b"payload"))

    with pytest.raises(DecodeError, match="trailing"):
        decode_frame(data + b"\x00")


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (pack_header([1, 2]), "must be a map"),
        (pack_header({1: "int key"}), None),  # msgpack's strict_map_key refuses it
        (pack_header({b"bytes key": 1}), "keys must be str"),
        (b"\xc1", None),
        (b"\x81\xa1a", "truncated"),
    ],
)
def test_bad_header_is_refused(header: bytes, match: str | None) -> None:
    with pytest.raises(DecodeError, match=match):
        decode_frame(raw_frame(header=header), limits=SMALL)


def test_header_nesting_over_the_cap_is_refused() -> None:
    deep: dict = {"x": 0}
    for _ in range(20):
        deep = {"x": deep}

    with pytest.raises(LimitExceeded):
        decode_frame(raw_frame(header=pack_header(deep)), limits=SMALL)


def test_pickle_bytes_are_refused() -> None:
    data = pickle.dumps({"payload": b"x" * 100})

    with pytest.raises(DecodeError, match="magic"):
        decode_frame(data, limits=SMALL)


def test_encode_refuses_non_str_header_keys() -> None:
    with pytest.raises(TypeError):
        encode_frame(Frame(FrameType.REQUEST, {1: "x"}))  # type: ignore[dict-item]


# --- fuzzing --------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(frames)
def test_random_frames_round_trip(frame: Frame) -> None:
    decoded = decode_frame(wire(frame), limits=SMALL)

    assert decoded.type == frame.type
    assert decoded.header == frame.header
    assert bytes(decoded.payload) == b"".join(frame.payload)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_decode_errors(data: bytes) -> None:
    assert outcome(lambda: decode_frame(data, limits=SMALL)) in OUTCOMES


@settings(max_examples=300, deadline=None)
@given(frames, st.data())
def test_mutated_frames_only_raise_decode_errors(frame: Frame, data: st.DataObject) -> None:
    buf = bytearray(wire(frame))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(buf) - 1))
        buf[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))

    try:
        decoded = decode_frame(bytes(buf[:cut]), limits=SMALL)
    except DecodeError:
        return
    assert isinstance(decoded.header, dict) and all(isinstance(key, str) for key in decoded.header)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 255), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_random_prefix_fields_are_checked_before_use(type_code: int, header_len: int, payload_len: int) -> None:
    prefix = struct.pack("!4sBBIQ", MAGIC, VERSION, type_code, header_len, payload_len)

    try:
        frame_type, checked_header, checked_payload = parse_prefix(prefix, limits=SMALL)
    except DecodeError:
        return
    assert frame_type in FrameType
    assert checked_header <= SMALL.max_header_bytes and checked_payload <= SMALL.max_payload_bytes
