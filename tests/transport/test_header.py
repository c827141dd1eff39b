"""transport.header: msgpack headers decode exactly, within every cap, and fail only with DecodeError."""

from __future__ import annotations

import pickle

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossamer.transport.errors import DecodeError, LimitExceeded
from gossamer.transport.header import check_depth, pack_header, unpack_header
from gossamer.transport.limits import Limits
from tests.transport.support import OUTCOMES, outcome

SMALL = Limits(max_header_bytes=256, max_str_bytes=16, max_container_len=4, max_depth=3)


def nested(depth: int) -> object:
    obj: object = 0
    for _ in range(depth):
        obj = [obj]
    return obj


def test_round_trip_of_every_header_type() -> None:
    header = {"i": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1], "f": 1.5, "s": "näme", "b": b"\x00\xff",
              "t": True, "n": None, "m": {"inner": [{"x": 1}]}}

    decoded = unpack_header(pack_header(header))

    assert decoded == header


def test_memoryview_and_bytearray_inputs_decode() -> None:
    data = pack_header({"k": [1, 2]})

    assert unpack_header(memoryview(data)) == unpack_header(bytearray(data)) == {"k": [1, 2]}


@pytest.mark.parametrize(("data", "error"), [
    (b"\x00" * 257, LimitExceeded),  # over max_header_bytes: refused before parsing
    (pack_header("x" * 17), LimitExceeded),  # str over max_str_bytes
    (pack_header(b"x" * 300)[:256], DecodeError),  # truncated bin
    (pack_header([1, 2, 3, 4, 5]), LimitExceeded),  # array over max_container_len
    (pack_header({str(i): i for i in range(5)}), LimitExceeded),  # map over max_container_len
    (b"\xdd\xff\xff\xff\xff", LimitExceeded),  # claims a 2**32-1 element array: refused before allocation
    (b"\xdf\xff\xff\xff\xff", LimitExceeded),  # claims a 2**32-1 entry map
    (b"\xdb\xff\xff\xff\xff", DecodeError),  # claims a 2**32-1 byte str (reported as truncated)
    (pack_header(nested(4)), LimitExceeded),  # deeper than max_depth=3
], ids=["header-bytes", "str", "bin-truncated", "array", "map", "array-2**32", "map-2**32", "str-2**32", "depth"])
def test_caps_are_enforced(data: bytes, error: type[DecodeError]) -> None:
    with pytest.raises(error):
        unpack_header(data, limits=SMALL)


def test_depth_at_the_cap_is_accepted() -> None:
    assert unpack_header(pack_header(nested(3)), limits=SMALL) == nested(3)


def test_very_deep_nesting_is_refused() -> None:
    data = b"\x91" * 100_000 + b"\xc0"

    with pytest.raises(DecodeError):
        unpack_header(data, limits=Limits(max_header_bytes=1 << 20))


@pytest.mark.parametrize("data", [
    b"",
    pack_header({"key": "value"})[:-1],
    pack_header([1, 2, 3])[:2],
    b"\xcf\x00\x00",  # uint64 cut short
], ids=["empty", "map", "array", "uint64"])
def test_truncated_header_is_refused(data: bytes) -> None:
    with pytest.raises(DecodeError, match="truncated"):
        unpack_header(data)


def test_trailing_bytes_are_refused() -> None:
    with pytest.raises(DecodeError, match="trailing"):
        unpack_header(pack_header({"a": 1}) + b"\x00")


@pytest.mark.parametrize("data", [
    msgpack.packb(msgpack.ExtType(5, b"abc")),
    msgpack.packb(msgpack.Timestamp(1, 0), datetime=False),
    b"\xc1",  # never-used msgpack byte
    b"\x81\x01\x02",  # int map key
    b"\xa2\xff\xfe",  # str that is not UTF-8
    pickle.dumps({"a": 1}),
    pickle.dumps([1, 2, 3]),
], ids=["ext", "timestamp", "c1", "int-key", "bad-utf8", "pickle-dict", "pickle-list"])
def test_non_header_bytes_are_refused(data: bytes) -> None:
    with pytest.raises(DecodeError):
        unpack_header(data)


@pytest.mark.parametrize(("obj", "max_depth", "refused"), [
    (1, 1, False),
    ({}, 1, False),
    ([[]], 1, True),
    ({"a": {"b": [1]}}, 3, False),
    ({"a": {"b": [1]}}, 2, True),
    ((1, (2, (3,))), 2, True),
])
def test_check_depth(obj: object, max_depth: int, refused: bool) -> None:
    if refused:
        with pytest.raises(LimitExceeded):
            check_depth(obj, max_depth)
    else:
        check_depth(obj, max_depth)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_raise_only_decode_errors(data: bytes) -> None:
    assert outcome(lambda: unpack_header(data, limits=SMALL)) in OUTCOMES


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=255), st.booleans())
def test_mutated_headers_raise_only_decode_errors(position: int, value: int, truncate: bool) -> None:
    data = bytearray(pack_header({"tensors": [{"name": "w", "shape": [2, 3], "nbytes": 24}], "x": 1.5}))
    position %= len(data)
    if truncate:
        del data[position:]
    else:
        data[position] = value

    assert outcome(lambda: unpack_header(bytes(data))) in OUTCOMES


@pytest.mark.parametrize("blob, error", [
    (b"\xc7\x00\x05", "ext type"),
    (b"\x81\xc4\x01a\x01", "keys must be strings"),
    (b"\xc1", "not valid msgpack"),
    (b"\xa2\xff\xfe", "not valid msgpack"),
])
def test_precise_errors_for_ext_bytes_keys_and_bad_bytes(blob: bytes, error: str) -> None:
    with pytest.raises(DecodeError, match=error) as info:
        unpack_header(blob)
    assert not isinstance(info.value, LimitExceeded)
