"""Join tokens: issue/verify round trip and every refusal."""

from __future__ import annotations

import base64

import msgpack
import pytest

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import canonical_bytes, sign_object
from gossamer.crypto.tokens import (
    MAX_TOKEN_CHARS,
    TOKEN_DOMAIN,
    JoinToken,
    issue_join_token,
    verify_join_token,
)

RUN = "demo@d75a9801"
NOW = 1_700_000_000.0
EXPIRES = NOW + 3600.0
NONCE = bytes(range(16))


@pytest.fixture
def owner() -> Identity:
    return Identity.from_private_bytes(
        bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    )


@pytest.fixture
def peer() -> Identity:
    return Identity.from_private_bytes(
        bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb")
    )


def verify(token: str, owner: Identity, peer: Identity, **overrides: object) -> JoinToken:
    kwargs: dict = {
        "owner_public_key": owner.public_key,
        "run_id": RUN,
        "now": NOW,
        "peer_public_key": peer.public_key,
    }
    kwargs.update(overrides)
    return verify_join_token(token, **kwargs)


def encode(blob: bytes) -> str:
    return base64.urlsafe_b64encode(blob).rstrip(b"=").decode("ascii")


def test_bound_token_round_trip(owner: Identity, peer: Identity) -> None:
    token = issue_join_token(
        owner, run_id=RUN, expires_at=EXPIRES, peer_public_key=peer.public_key, nonce=NONCE
    )

    verified = verify(token, owner, peer)

    assert verified == JoinToken(
        run_id=RUN,
        expires_at=EXPIRES,
        peer_public_key=peer.public_key,
        nonce=NONCE,
        owner_public_key=owner.public_key,
    )
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_bearer_token_admits_any_peer(owner: Identity, peer: Identity) -> None:
    token = issue_join_token(owner, run_id=RUN, expires_at=EXPIRES, nonce=NONCE)

    first = verify(token, owner, peer)
    second = verify(token, owner, Identity.generate())

    assert first.peer_public_key is None
    assert second.run_id == RUN


@pytest.mark.parametrize(
    "override",
    [{"run_id": "demo@00000000"}, {"now": EXPIRES}, {"now": EXPIRES + 1.0}, {"now": float("nan")}],
    ids=["other-run", "expired-at-boundary", "expired", "nan-now"],
)
def test_binding_mismatches_are_refused(owner: Identity, peer: Identity, override: dict) -> None:
    token = issue_join_token(
        owner, run_id=RUN, expires_at=EXPIRES, peer_public_key=peer.public_key, nonce=NONCE
    )

    with pytest.raises(VerificationError):
        verify(token, owner, peer, **override)


def test_just_before_expiry_is_accepted(owner: Identity, peer: Identity) -> None:
    token = issue_join_token(owner, run_id=RUN, expires_at=EXPIRES, nonce=NONCE)

    assert verify(token, owner, peer, now=EXPIRES - 0.001).expires_at == EXPIRES


def test_token_bound_to_another_peer_is_refused(owner: Identity, peer: Identity) -> None:
    token = issue_join_token(
        owner, run_id=RUN, expires_at=EXPIRES, peer_public_key=peer.public_key, nonce=NONCE
    )

    with pytest.raises(VerificationError):
        verify(token, owner, Identity.generate())


def test_token_from_another_owner_is_refused(owner: Identity, peer: Identity) -> None:
    impostor = Identity.generate()
    token = issue_join_token(impostor, run_id=RUN, expires_at=EXPIRES, nonce=NONCE)

    with pytest.raises(VerificationError):
        verify(token, owner, peer)


def test_every_flipped_character_is_refused(owner: Identity, peer: Identity) -> None:
    token = issue_join_token(
        owner, run_id=RUN, expires_at=EXPIRES, peer_public_key=peer.public_key, nonce=NONCE
    )
    refused = 0

    for index, char in enumerate(token):
        swapped = "B" if char == "A" else "A"
        try:
            verify(token[:index] + swapped + token[index + 1 :], owner, peer)
        except VerificationError:
            refused += 1

    assert refused == len(token)


@pytest.mark.parametrize(
    "text",
    ["", "!!!!", "abc=", "a", "a b", "é" * 8, "A" * (MAX_TOKEN_CHARS + 1)],
    ids=["empty", "punctuation", "padding", "one-char", "space", "non-ascii", "too-long"],
)
def test_bad_encodings_are_refused(owner: Identity, peer: Identity, text: str) -> None:
    with pytest.raises(VerificationError):
        verify(text, owner, peer)


def test_non_canonical_base64_is_refused(owner: Identity, peer: Identity) -> None:
    token = issue_join_token(owner, run_id=RUN, expires_at=EXPIRES, nonce=NONCE)
    assert len(token) % 4 != 0  # the last char carries unused bits
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(token[-1])
    variant = token[:-1] + alphabet[last ^ 1]  # same bytes once decoded, different text

    assert base64.urlsafe_b64decode(variant + "=" * (-len(variant) % 4)) == base64.urlsafe_b64decode(
        token + "=" * (-len(token) % 4)
    )
    with pytest.raises(VerificationError):
        verify(variant, owner, peer)


def test_signed_record_is_not_a_token(owner: Identity, peer: Identity) -> None:
    body = {"run": RUN, "exp": EXPIRES, "peer": None, "nonce": NONCE}
    as_record = encode(sign_object(owner, body))
    body_bytes = canonical_bytes(body)
    as_token = encode(
        msgpack.packb(
            {"body": body_bytes, "pub": owner.public_key, "sig": owner.sign(TOKEN_DOMAIN + body_bytes)},
            use_bin_type=True,
        )
    )

    assert verify(as_token, owner, peer).run_id == RUN
    with pytest.raises(VerificationError):
        verify(as_record, owner, peer)


@pytest.mark.parametrize(
    "changes",
    [{"exp": 1_800_000_000}, {"nonce": b"short"}, {"peer": b"\x00" * 31}, {"run": 5}, {"extra": True}],
    ids=repr,
)
def test_well_signed_but_malformed_bodies_are_refused(owner: Identity, peer: Identity, changes: dict) -> None:
    body = {"run": RUN, "exp": EXPIRES, "peer": None, "nonce": NONCE, **changes}
    body_bytes = canonical_bytes(body)
    blob = msgpack.packb(
        {"body": body_bytes, "pub": owner.public_key, "sig": owner.sign(TOKEN_DOMAIN + body_bytes)},
        use_bin_type=True,
    )

    with pytest.raises(VerificationError):
        verify(encode(blob), owner, peer)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("run_id", {"run_id": ""}),
        ("expires_at", {"expires_at": float("inf")}),
        ("peer_public_key", {"peer_public_key": b"\x00" * 33}),
        ("nonce", {"nonce": b"\x00" * 8}),
        ("MAX_TOKEN_CHARS", {"run_id": "r" * MAX_TOKEN_CHARS}),
    ],
)
def test_issue_validates_arguments(owner: Identity, field: str, kwargs: dict) -> None:
    args: dict = {"run_id": RUN, "expires_at": EXPIRES, "nonce": NONCE}
    args.update(kwargs)

    with pytest.raises(ValueError, match=field):
        issue_join_token(owner, **args)
