"""Envelopes: seal/open round trip, every refusal (the request's method and target included), the
check-before-payload / admit-after-payload split, replay memory bounds. Time is a parameter."""

from __future__ import annotations

import hashlib

import msgpack
import pytest

from gossamer.crypto.envelope import (
    ENVELOPE_DOMAIN,
    Envelope,
    ReplayGuard,
    ReplayGuardConfig,
    payload_digest,
    seal,
)
from gossamer.crypto.errors import VerificationError
from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import SIGNED_DOMAIN, canonical_bytes, sign_object

RUN = "demo@d75a9801"
NOW = 1_700_000_000.0
PAYLOAD = b"tensor bytes" * 100
METHOD = "PUT"
TARGET = "/blocktrain/update/0/4"


@pytest.fixture
def alice() -> Identity:
    return Identity.from_private_bytes(
        bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb")
    )


@pytest.fixture
def bob() -> Identity:
    return Identity.from_private_bytes(
        bytes.fromhex("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7")
    )


def nonce(i: int) -> bytes:
    return i.to_bytes(16, "big")


def sealed(sender: Identity, recipient: Identity, *, now: float = NOW, n: int = 1, round: int = 4) -> bytes:
    return seal(
        sender,
        recipient=recipient.peer_id,
        run_id=RUN,
        round=round,
        method=METHOD,
        target=TARGET,
        payload_digest=payload_digest(PAYLOAD),
        now=now,
        nonce=nonce(n),
    )


def open_as(
    guard: ReplayGuard, blob: bytes, receiver: Identity, *, now: float = NOW, **overrides: object
) -> Envelope:
    kwargs: dict = {
        "me": receiver.peer_id,
        "run_id": RUN,
        "method": METHOD,
        "target": TARGET,
        "payload_digest": payload_digest(PAYLOAD),
        "now": now,
    }
    kwargs.update(overrides)
    return guard.open(blob, **kwargs)


def test_payload_digest_is_sha256_of_concatenation() -> None:
    parts = [b"abc", bytearray(b"def"), memoryview(b"ghi")]

    digest = payload_digest(*parts)

    assert digest == hashlib.sha256(b"abcdefghi").digest()
    assert payload_digest() == hashlib.sha256(b"").digest()


def test_round_trip(alice: Identity, bob: Identity) -> None:
    blob = sealed(alice, bob)

    envelope = open_as(ReplayGuard(), blob, bob)

    assert envelope == Envelope(
        sender=alice.peer_id,
        sender_public_key=alice.public_key,
        recipient=bob.peer_id,
        run_id=RUN,
        round=4,
        method=METHOD,
        target=TARGET,
        timestamp=NOW,
        nonce=nonce(1),
        payload_digest=payload_digest(PAYLOAD),
    )


def test_pinned_sender_key(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard()

    assert (
        open_as(guard, sealed(alice, bob, n=1), bob, expected_public_key=alice.public_key).sender
        == alice.peer_id
    )
    with pytest.raises(VerificationError):
        open_as(guard, sealed(alice, bob, n=2), bob, expected_public_key=bob.public_key)


@pytest.mark.parametrize(
    "override",
    [
        {"me": "ff" * 32},
        {"run_id": "demo@00000000"},
        {"payload_digest": payload_digest(PAYLOAD + b"!")},
        {"now": NOW + 60.001},
        {"now": NOW - 60.001},
        {"target": "/blocktrain/update/1/4"},
        {"target": "/blocktrain/update/0/4?x=1"},
        {"method": "POST"},
    ],
    ids=["other-recipient", "other-run", "other-payload", "stale", "future", "other-path", "other-query",
         "other-method"],
)
def test_binding_mismatches_are_refused(alice: Identity, bob: Identity, override: dict) -> None:
    blob = sealed(alice, bob)

    with pytest.raises(VerificationError) as caught:
        open_as(ReplayGuard(), blob, bob, **override)

    assert str(caught.value) == "verification failed"


def test_window_edges_are_accepted(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard(ReplayGuardConfig(window_s=60.0))

    late = open_as(guard, sealed(alice, bob, n=1, now=NOW - 60.0), bob)
    early = open_as(guard, sealed(alice, bob, n=2, now=NOW + 60.0), bob)

    assert (late.timestamp, early.timestamp) == (NOW - 60.0, NOW + 60.0)


def test_replay_is_refused_and_other_nonce_accepted(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard()
    first = sealed(alice, bob, n=1)
    open_as(guard, first, bob)

    with pytest.raises(VerificationError):
        open_as(guard, first, bob, now=NOW + 30.0)

    assert open_as(guard, sealed(alice, bob, n=2), bob).nonce == nonce(2)


def test_same_nonce_from_two_senders_is_fine(alice: Identity, bob: Identity) -> None:
    carol = Identity.generate()
    guard = ReplayGuard()

    from_alice = open_as(guard, sealed(alice, bob, n=9), bob)
    from_carol = open_as(guard, sealed(carol, bob, n=9), bob)

    assert from_alice.nonce == from_carol.nonce
    assert len(guard) == 2


def test_every_flipped_byte_is_refused(alice: Identity, bob: Identity) -> None:
    blob = sealed(alice, bob)
    refused = 0

    for index in range(len(blob)):
        tampered = bytearray(blob)
        tampered[index] ^= 0x01
        try:
            open_as(ReplayGuard(), bytes(tampered), bob)
        except VerificationError:
            refused += 1

    assert refused == len(blob)


def _forged(signer: Identity, body: dict, *, domain: bytes = ENVELOPE_DOMAIN) -> bytes:
    body_bytes = canonical_bytes(body)
    sig = signer.sign(domain + body_bytes)
    return msgpack.packb({"body": body_bytes, "pub": signer.public_key, "sig": sig}, use_bin_type=True)


def _body(sender_id: str, to: Identity, **changes: object) -> dict:
    body = {
        "sender": sender_id,
        "recipient": to.peer_id,
        "run": RUN,
        "round": 4,
        "method": METHOD,
        "target": TARGET,
        "ts": NOW,
        "nonce": nonce(1),
        "digest": payload_digest(PAYLOAD),
    }
    body.update(changes)
    return body


def test_sender_must_be_fingerprint_of_signing_key(alice: Identity, bob: Identity) -> None:
    claims_to_be_bob = _forged(alice, _body(bob.peer_id, bob))
    honest = _forged(alice, _body(alice.peer_id, bob))

    assert open_as(ReplayGuard(), honest, bob).sender == alice.peer_id
    with pytest.raises(VerificationError):
        open_as(ReplayGuard(), claims_to_be_bob, bob)


@pytest.mark.parametrize(
    "changes",
    [
        {"round": -1},
        {"round": True},
        {"round": "4"},
        {"ts": 1_700_000_000},
        {"ts": float("nan")},
        {"nonce": b"short"},
        {"digest": b"\x00" * 31},
        {"extra": 1},
        {"recipient": None},
        {"method": "put"},
        {"method": ""},
        {"target": "blocktrain/update/0/4"},
        {"target": "/" + "x" * 2048},
        {"target": b"/x"},
    ],
    ids=repr,
)
def test_well_signed_but_malformed_bodies_are_refused(alice: Identity, bob: Identity, changes: dict) -> None:
    blob = _forged(alice, _body(alice.peer_id, bob, **changes))

    with pytest.raises(VerificationError):
        open_as(ReplayGuard(), blob, bob)


def test_signature_from_another_domain_is_refused(alice: Identity, bob: Identity) -> None:
    as_record = sign_object(alice, _body(alice.peer_id, bob))
    with_record_domain = _forged(alice, _body(alice.peer_id, bob), domain=SIGNED_DOMAIN)

    for blob in (as_record, with_record_domain):
        with pytest.raises(VerificationError):
            open_as(ReplayGuard(), blob, bob)


def test_refused_envelopes_are_not_remembered(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard()
    blob = sealed(alice, bob)
    with pytest.raises(VerificationError):
        open_as(guard, blob, bob, run_id="other@run")

    envelope = open_as(guard, blob, bob)

    assert envelope.nonce == nonce(1)


def check_as(guard: ReplayGuard, blob: bytes, receiver: Identity, *, now: float = NOW) -> Envelope:
    return guard.check(blob, me=receiver.peer_id, run_id=RUN, method=METHOD, target=TARGET, now=now)


def test_check_refuses_before_the_payload_and_admit_checks_the_digest(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard()
    envelope = check_as(guard, sealed(alice, bob), bob)

    with pytest.raises(VerificationError):
        guard.admit(envelope, payload_digest=payload_digest(PAYLOAD + b"!"), now=NOW)
    guard.admit(envelope, payload_digest=payload_digest(PAYLOAD), now=NOW)

    assert len(guard) == 1
    with pytest.raises(VerificationError):
        check_as(guard, sealed(alice, bob), bob)  # remembered: a replay


def test_a_held_nonce_refuses_duplicates_until_released(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard()
    blob = sealed(alice, bob)
    forged_body = check_as(guard, blob, bob)  # someone replays the envelope with another body

    with pytest.raises(VerificationError):
        check_as(guard, blob, bob)  # while that body arrives, the same nonce is held
    with pytest.raises(VerificationError):
        guard.admit(forged_body, payload_digest=payload_digest(b"not the payload"), now=NOW)
    guard.release(forged_body)
    genuine = check_as(guard, blob, bob)
    guard.admit(genuine, payload_digest=payload_digest(PAYLOAD), now=NOW)

    assert genuine.nonce == nonce(1) and len(guard) == 1


def test_a_payload_slower_than_the_window_is_admitted_once(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard(ReplayGuardConfig(window_s=10.0))
    blob = sealed(alice, bob)
    envelope = check_as(guard, blob, bob)

    guard.admit(envelope, payload_digest=payload_digest(PAYLOAD), now=NOW + 100.0)

    with pytest.raises(VerificationError):
        guard.admit(envelope, payload_digest=payload_digest(PAYLOAD), now=NOW + 100.0)
    with pytest.raises(VerificationError):
        check_as(guard, blob, bob, now=NOW + 5.0)  # below the floor now


def test_old_entries_are_pruned(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard(ReplayGuardConfig(window_s=10.0))
    for i in range(5):
        open_as(guard, sealed(alice, bob, n=i, now=NOW + i), bob, now=NOW + i)
    assert len(guard) == 5

    open_as(guard, sealed(alice, bob, n=100, now=NOW + 12.5), bob, now=NOW + 12.5)

    assert len(guard) == 3  # timestamps NOW+3, NOW+4 and the new one remain


def test_full_memory_fails_closed_until_entries_age_out(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard(ReplayGuardConfig(window_s=10.0, max_entries=3))
    for i in range(3):
        open_as(guard, sealed(alice, bob, n=i), bob)

    with pytest.raises(VerificationError):
        open_as(guard, sealed(alice, bob, n=3), bob)
    later = open_as(guard, sealed(alice, bob, n=4, now=NOW + 11.0), bob, now=NOW + 11.0)

    assert later.nonce == nonce(4)
    assert len(guard) == 1


def test_clock_stepping_back_does_not_reopen_replays(alice: Identity, bob: Identity) -> None:
    guard = ReplayGuard(ReplayGuardConfig(window_s=10.0))
    old = sealed(alice, bob, n=1, now=NOW)
    open_as(guard, old, bob, now=NOW)
    open_as(guard, sealed(alice, bob, n=2, now=NOW + 20.0), bob, now=NOW + 20.0)  # prunes the old nonce

    with pytest.raises(VerificationError):
        open_as(guard, old, bob, now=NOW + 5.0)  # inside old's window, but below the guard's floor


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("nonce", b"\x00" * 15),
        ("payload_digest", b"\x00" * 31),
        ("round", -1),
        ("now", float("inf")),
        ("recipient", ""),
        ("method", "put"),
        ("target", "no/leading/slash"),
    ],
)
def test_seal_validates_arguments(alice: Identity, bob: Identity, field: str, value: object) -> None:
    kwargs: dict = {
        "recipient": bob.peer_id,
        "run_id": RUN,
        "round": 1,
        "method": METHOD,
        "target": TARGET,
        "payload_digest": payload_digest(PAYLOAD),
        "now": NOW,
        "nonce": nonce(1),
    }
    kwargs[field] = value

    with pytest.raises(ValueError, match=field):
        seal(alice, **kwargs)


@pytest.mark.parametrize(
    ("field", "value"), [("window_s", 0.0), ("window_s", float("nan")), ("max_entries", 0)]
)
def test_config_validates_fields(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ReplayGuardConfig(**{field: value})


def test_a_restarted_guard_refuses_what_the_previous_process_admitted(alice: Identity, bob: Identity) -> None:
    """Replay memory is lost on a restart: a guard without a start floor takes the captured
    envelope again (the attack); one built with ``started_at`` refuses everything stamped before
    it started, and still takes fresh envelopes."""
    blob = sealed(alice, bob, now=NOW)
    open_as(ReplayGuard(started_at=NOW - 100.0), blob, bob, now=NOW)
    restart = NOW + 5.0

    assert open_as(ReplayGuard(), blob, bob, now=restart).sender == alice.peer_id  # no floor: replayed
    restarted = ReplayGuard(started_at=restart)
    with pytest.raises(VerificationError):
        open_as(restarted, blob, bob, now=restart)
    assert open_as(restarted, sealed(alice, bob, now=restart, n=2), bob, now=restart).sender == alice.peer_id
    with pytest.raises(ValueError, match="started_at"):
        ReplayGuard(started_at=float("nan"))


def test_a_nonce_is_remembered_only_by_admit(alice: Identity, bob: Identity) -> None:
    """A receiver whose admission check refuses the sender releases it after ``check``: the
    memory stays empty however many strangers write, so they cannot fill it."""
    guard = ReplayGuard(ReplayGuardConfig(max_entries=2))
    for n in range(10):
        envelope = check_as(guard, sealed(Identity.generate(), bob, n=n), bob)
        guard.release(envelope)  # refused by the admission check: never admitted
    assert len(guard) == 0
    assert open_as(guard, sealed(alice, bob), bob).sender == alice.peer_id and len(guard) == 1
