"""Signed objects: canonical encoding, round trip, and refusal of every kind of bad blob."""

from __future__ import annotations

import math

import msgpack
import pytest

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import SIGNED_DOMAIN, canonical_bytes, open_signed, sign_object

SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RECORD = {
    "peer_id": "ab" * 32,
    "addresses": ["127.0.0.1:4000", "[::1]:4001"],
    "roles": ["learner"],
    "capacity": {"device": "cpu", "memory_bytes": 1 << 34, "step_s": 0.25},
    "round": 7,
    "alive": True,
    "note": None,
    "blob": b"\x00\x01",
}


@pytest.fixture
def owner() -> Identity:
    return Identity.from_private_bytes(SEED)


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_canonical_bytes_sorts_keys_recursively() -> None:
    one = {"b": 1, "a": {"z": [1, {"y": 2, "x": 3}], "c": b"\x00"}}
    two = {"a": {"c": b"\x00", "z": [1, {"x": 3, "y": 2}]}, "b": 1}

    encoded = canonical_bytes(one)

    assert encoded == canonical_bytes(two)
    assert encoded == pack({"a": {"c": b"\x00", "z": [1, {"x": 3, "y": 2}]}, "b": 1})
    assert msgpack.unpackb(encoded) == one


@pytest.mark.parametrize(
    "bad",
    [{1: "int key"}, {"k": (1, 2)}, {"k": {1.5}}, {"k": object()}, {"k": bytearray(b"x")}, {b"k": 1}],
    ids=["int-key", "tuple", "set", "object", "bytearray", "bytes-key"],
)
def test_canonical_bytes_refuses_other_types(bad: dict) -> None:
    with pytest.raises(TypeError):
        canonical_bytes(bad)


def test_canonical_bytes_refuses_deep_nesting_and_huge_ints() -> None:
    deep: list = []
    for _ in range(16):
        deep = [deep]

    with pytest.raises(ValueError):
        canonical_bytes(deep)
    with pytest.raises(ValueError):
        canonical_bytes({"n": 1 << 70})


def test_round_trip(owner: Identity) -> None:
    blob = sign_object(owner, RECORD)

    body, public_key = open_signed(blob)

    assert body == RECORD
    assert public_key == owner.public_key
    assert open_signed(blob, expected_public_key=owner.public_key)[0] == RECORD


def test_signature_covers_domain_and_canonical_body(owner: Identity) -> None:
    blob = sign_object(owner, RECORD)

    outer = msgpack.unpackb(blob)

    assert set(outer) == {"body", "pub", "sig"}
    assert outer["body"] == canonical_bytes(RECORD)
    assert outer["sig"] == owner.sign(SIGNED_DOMAIN + canonical_bytes(RECORD))


def test_every_flipped_byte_is_refused(owner: Identity) -> None:
    blob = sign_object(owner, {"run": "demo@abcd", "round": 3})
    refused = 0

    for index in range(len(blob)):
        tampered = bytearray(blob)
        tampered[index] ^= 0x01
        try:
            open_signed(bytes(tampered))
        except VerificationError:
            refused += 1

    assert refused == len(blob)


def test_other_expected_key_is_refused(owner: Identity) -> None:
    blob = sign_object(owner, RECORD)

    with pytest.raises(VerificationError):
        open_signed(blob, expected_public_key=Identity.generate().public_key)


def test_key_swap_is_refused(owner: Identity) -> None:
    outer = msgpack.unpackb(sign_object(owner, RECORD))
    outer["pub"] = Identity.generate().public_key

    with pytest.raises(VerificationError):
        open_signed(pack(outer))


def test_signature_from_another_domain_is_refused(owner: Identity) -> None:
    body = canonical_bytes(RECORD)
    forged = pack(
        {"body": body, "pub": owner.public_key, "sig": owner.sign(b"gossamer-envelope-v1\0" + body)}
    )

    with pytest.raises(VerificationError):
        open_signed(forged)


def test_too_big_is_refused(owner: Identity) -> None:
    blob = sign_object(owner, {"pad": b"x" * 2000})

    assert open_signed(blob, max_bytes=len(blob))[0] == {"pad": b"x" * 2000}
    with pytest.raises(VerificationError):
        open_signed(blob, max_bytes=len(blob) - 1)


def _resigned(owner: Identity, body_bytes: bytes) -> bytes:
    """A correctly signed blob around arbitrary body bytes: only the body checks can refuse it."""
    return pack({"body": body_bytes, "pub": owner.public_key, "sig": owner.sign(SIGNED_DOMAIN + body_bytes)})


def _nested(depth: int) -> dict:
    obj: dict = {}
    for _ in range(depth - 1):
        obj = {"k": obj}
    return obj


def test_depth_limit_is_sixteen(owner: Identity) -> None:
    at_limit = _resigned(owner, pack(_nested(16)))
    over_limit = _resigned(owner, pack(_nested(17)))

    assert open_signed(at_limit)[0] == _nested(16)
    with pytest.raises(VerificationError):
        open_signed(over_limit)


@pytest.mark.parametrize(
    "body_bytes",
    [
        pack([1, 2, 3]),
        pack({1: "int key"}),
        pack({b"bytes key": 1}),
        pack({"a": 1}) + b"\x00",
        b"\xc1",
        pack({"a": msgpack.ExtType(5, b"x")}),
        b"\xdd\xff\xff\xff\xff",
        b"\xa3\xff\xfe\xfd",
        b"",
    ],
    ids=["list", "int-key", "bytes-key", "trailing", "reserved", "ext", "huge-array", "bad-utf8", "empty"],
)
def test_malformed_bodies_are_refused(owner: Identity, body_bytes: bytes) -> None:
    blob = _resigned(owner, body_bytes)

    with pytest.raises(VerificationError):
        open_signed(blob)


def _outer_variants(owner: Identity) -> list[object]:
    good = msgpack.unpackb(sign_object(owner, RECORD))
    return [
        {"body": good["body"], "pub": good["pub"]},
        {**good, "extra": 1},
        {**good, "body": "text"},
        {**good, "pub": good["pub"][:31]},
        {**good, "sig": good["sig"] + b"\x00"},
        {**good, "sig": None},
        [good["body"], good["pub"], good["sig"]],
        {"body": {"nested": 1}, "pub": good["pub"], "sig": good["sig"]},
    ]


def test_malformed_outer_maps_are_refused(owner: Identity) -> None:
    variants = _outer_variants(owner)
    refused = 0

    for variant in variants:
        with pytest.raises(VerificationError):
            open_signed(pack(variant))
        refused += 1

    assert refused == 8


@pytest.mark.parametrize("blob", [b"", b"\x00", b"not msgpack at all", "text", None, 12], ids=repr)
def test_garbage_is_refused(blob: object) -> None:
    with pytest.raises(VerificationError):
        open_signed(blob)  # type: ignore[arg-type]


def test_floats_survive_exactly(owner: Identity) -> None:
    body = {"lr": 3e-4, "tiny": 5e-324, "inf": math.inf}

    opened, _ = open_signed(sign_object(owner, body))

    assert opened == body
