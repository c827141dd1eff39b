"""Answers to a fresh challenge (``crypto.challenge``): good for one nonce, one audience and a time
window; anything else (another nonce, audience or key, a stale or future time, a tampered byte, a
signed object of another domain) fails with the one opaque VerificationError."""

from __future__ import annotations

import msgpack
import pytest

from gossamer.crypto.challenge import NONCE_BYTES, answer_challenge, check_answer
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import sign_object

ME = Identity.generate()
NONCE = bytes(range(NONCE_BYTES))
NOW = 1_000_000.0


def check(blob: bytes, **overrides: object) -> bytes:
    args = {"nonce": NONCE, "audience": "relay-1", "now": NOW, "skew_s": 30.0, **overrides}
    return check_answer(blob, **args)  # type: ignore[arg-type]


def test_an_answer_names_its_signer() -> None:
    blob = answer_challenge(ME, nonce=NONCE, audience="relay-1", now=NOW - 29.0)
    assert check(blob) == ME.public_key
    assert check(answer_challenge(ME, nonce=NONCE, audience="relay-1", now=NOW + 29.0)) == ME.public_key


@pytest.mark.parametrize("overrides", [
    {"nonce": bytes(NONCE_BYTES)},  # replayed on a connection with another challenge
    {"audience": "relay-2"},  # relayed to another service
    {"now": NOW + 31.0},  # stale
    {"now": NOW - 31.0},  # from the future
])
def test_an_answer_holds_only_for_its_nonce_audience_and_time(overrides: dict) -> None:
    blob = answer_challenge(ME, nonce=NONCE, audience="relay-1", now=NOW)
    with pytest.raises(VerificationError):
        check(blob, **overrides)


def test_tampered_and_foreign_blobs_fail() -> None:
    blob = answer_challenge(ME, nonce=NONCE, audience="relay-1", now=NOW)
    outer = msgpack.unpackb(blob)
    forged = msgpack.packb({**outer, "pub": Identity.generate().public_key})
    tampered = blob[:-1] + bytes([blob[-1] ^ 1])
    same_body_other_domain = sign_object(ME, {"nonce": NONCE, "audience": "relay-1", "t": NOW})
    for bad in (forged, tampered, same_body_other_domain, b"", b"\x00" * 64):
        with pytest.raises(VerificationError):
            check(bad)


@pytest.mark.parametrize("kwargs", [
    {"nonce": b"short"}, {"nonce": "x" * NONCE_BYTES}, {"audience": ""}, {"audience": "x" * 257},
    {"now": float("nan")},
])
def test_bad_input_to_answer_is_refused(kwargs: dict) -> None:
    args = {"nonce": NONCE, "audience": "relay-1", "now": NOW, **kwargs}
    with pytest.raises(ValueError):
        answer_challenge(ME, **args)
