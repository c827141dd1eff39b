"""Channel encryption: both directions, and refusal of tampered/reordered/replayed frames (the
handshake that makes the keys: ``test_handshake``)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from gossamer.crypto.channel import MAX_COUNTER, SecureChannel
from gossamer.crypto.errors import CryptoError, VerificationError
from gossamer.crypto.handshake import Initiator, Responder
from gossamer.crypto.identity import Identity

RUN = "tl@d75a9801"
EPH_A = bytes(range(32))
EPH_B = bytes(range(32, 64))
NONCE_A, NONCE_B = bytes(16), bytes([1]) * 16


@pytest.fixture
def alice() -> Identity:
    return Identity.from_private_bytes(
        bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    )


@pytest.fixture
def bob() -> Identity:
    return Identity.from_private_bytes(
        bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb")
    )


def connect(
    alice: Identity, bob: Identity, *, eph_a: bytes | None = EPH_A, eph_b: bytes | None = EPH_B
) -> tuple[SecureChannel, SecureChannel]:
    """The whole handshake, alice initiating: (alice's channel, bob's channel)."""
    fixed = eph_a is not None and eph_b is not None
    a = Initiator(alice, peer_public_key=bob.public_key, run_id=RUN, ephemeral=eph_a,
                  nonce=NONCE_A if fixed else None)
    b = Responder(bob, peer_public_key=alice.public_key, run_id=RUN, ephemeral=eph_b,
                  nonce=NONCE_B if fixed else None)
    channel_b, ack = b.confirm(a.confirm(b.answer(a.hello())))
    return a.finish(ack), channel_b


def test_round_trip_both_directions(alice: Identity, bob: Identity) -> None:
    a, b = connect(alice, bob)
    share = memoryview(bytes(range(256)) * 64)

    to_bob = [a.encrypt(share, b"frame-0"), a.encrypt(b"second")]
    to_alice = b.encrypt(b"reply", b"ad")

    assert b.decrypt(to_bob[0], b"frame-0") == bytes(share)
    assert b.decrypt(to_bob[1]) == b"second"
    assert a.decrypt(to_alice, b"ad") == b"reply"
    assert (a.frames_sent, b.frames_received, b.frames_sent, a.frames_received) == (3, 3, 2, 2)  # 1 handshake frame each


def test_ciphertext_hides_plaintext_and_adds_a_tag(alice: Identity, bob: Identity) -> None:
    a, _ = connect(alice, bob)
    plaintext = b"\x00" * 64

    first, second = a.encrypt(plaintext), a.encrypt(plaintext)

    assert len(first) == len(plaintext) + 16
    assert plaintext not in first
    assert first != second  # a fresh counter nonce per frame


def test_directions_use_different_keys(alice: Identity, bob: Identity) -> None:
    a, b = connect(alice, bob)
    from_alice = a.encrypt(b"same")
    from_bob = b.encrypt(b"same")

    assert from_alice != from_bob
    with pytest.raises(VerificationError):
        a.decrypt(from_alice)  # reflecting a frame back to its sender fails


def test_fixed_ephemerals_are_deterministic(alice: Identity, bob: Identity) -> None:
    first, _ = connect(alice, bob)
    second, _ = connect(alice, bob)

    assert first.encrypt(b"x") == second.encrypt(b"x")


def test_two_sessions_get_different_keys(alice: Identity, bob: Identity) -> None:
    session_1, peer_1 = connect(alice, bob, eph_a=None, eph_b=None)
    session_2, peer_2 = connect(alice, bob, eph_a=None, eph_b=None)

    frame_1, frame_2 = session_1.encrypt(b"share"), session_2.encrypt(b"share")

    assert frame_1 != frame_2
    with pytest.raises(VerificationError):
        peer_2.decrypt(frame_1)
    assert peer_1.decrypt(frame_1) == b"share"


@pytest.mark.parametrize("case", ["flip-first", "flip-tag", "truncate", "extend", "empty", "wrong-ad"])
def test_tampered_frames_are_refused(alice: Identity, bob: Identity, case: str) -> None:
    a, b = connect(alice, bob)
    frame = bytearray(a.encrypt(b"secret share", b"hdr"))
    ad = b"hdr"
    if case == "flip-first":
        frame[0] ^= 1
    elif case == "flip-tag":
        frame[-1] ^= 1
    elif case == "truncate":
        del frame[-1]
    elif case == "extend":
        frame += b"\x00"
    elif case == "empty":
        frame = bytearray()
    else:
        ad = b"other"

    with pytest.raises(VerificationError):
        b.decrypt(bytes(frame), ad)


def test_reorder_and_replay_are_refused(alice: Identity, bob: Identity) -> None:
    a, b = connect(alice, bob)
    first, second = a.encrypt(b"one"), a.encrypt(b"two")
    b_replay = connect(alice, bob)[1]

    with pytest.raises(VerificationError):
        b.decrypt(second)  # out of order
    assert b_replay.decrypt(first) == b"one"
    with pytest.raises(VerificationError):
        b_replay.decrypt(first)  # the same frame again


def test_a_failure_poisons_the_receiving_side(alice: Identity, bob: Identity) -> None:
    a, b = connect(alice, bob)
    good = a.encrypt(b"one")
    with pytest.raises(VerificationError):
        b.decrypt(good[:-1])

    with pytest.raises(VerificationError):
        b.decrypt(good)  # would have been valid, but the channel is dead


def test_counter_overflow_is_refused() -> None:
    key_ab, key_ba = bytes(32), bytes([1]) * 32
    sender = SecureChannel(send_key=key_ab, recv_key=key_ba, send_counter=MAX_COUNTER)
    receiver = SecureChannel(send_key=key_ba, recv_key=key_ab, recv_counter=MAX_COUNTER)

    last = sender.encrypt(b"last")

    assert last == ChaCha20Poly1305(key_ab).encrypt(b"\xff" * 12, b"last", b"")
    assert receiver.decrypt(last) == b"last"
    with pytest.raises(CryptoError):
        sender.encrypt(b"one too many")
    with pytest.raises(VerificationError):
        receiver.decrypt(last)


def test_first_nonce_is_zero_counter() -> None:
    key = bytes(range(32))
    channel = SecureChannel(send_key=key, recv_key=key)

    frame = channel.encrypt(b"hello", b"ad")

    assert frame == ChaCha20Poly1305(key).encrypt(bytes(12), b"hello", b"ad")
