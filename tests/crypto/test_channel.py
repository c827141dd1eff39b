"""Channel encryption: handshake, both directions, and refusal of tampered/reordered/replayed frames."""

from __future__ import annotations

import msgpack
import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from gossamer.crypto.channel import MAX_COUNTER, ChannelHandshake, SecureChannel
from gossamer.crypto.errors import CryptoError, VerificationError
from gossamer.crypto.identity import Identity

RUN = "tl@d75a9801"
EPH_A = bytes(range(32))
EPH_B = bytes(range(32, 64))


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


def handshakes(
    alice: Identity, bob: Identity, *, eph_a: bytes | None = EPH_A, eph_b: bytes | None = EPH_B
) -> tuple[ChannelHandshake, ChannelHandshake]:
    a = ChannelHandshake(alice, peer_public_key=bob.public_key, run_id=RUN, initiator=True, ephemeral=eph_a)
    b = ChannelHandshake(bob, peer_public_key=alice.public_key, run_id=RUN, initiator=False, ephemeral=eph_b)
    return a, b


def connect(
    alice: Identity, bob: Identity, **ephemerals: bytes | None
) -> tuple[SecureChannel, SecureChannel]:
    a, b = handshakes(alice, bob, **ephemerals)
    hello_a, hello_b = a.hello(), b.hello()
    return a.finish(hello_b), b.finish(hello_a)


def test_round_trip_both_directions(alice: Identity, bob: Identity) -> None:
    a, b = connect(alice, bob)
    share = memoryview(bytes(range(256)) * 64)

    to_bob = [a.encrypt(share, b"frame-0"), a.encrypt(b"second")]
    to_alice = b.encrypt(b"reply", b"ad")

    assert b.decrypt(to_bob[0], b"frame-0") == bytes(share)
    assert b.decrypt(to_bob[1]) == b"second"
    assert a.decrypt(to_alice, b"ad") == b"reply"
    assert (a.frames_sent, b.frames_received, b.frames_sent, a.frames_received) == (2, 2, 1, 1)


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


def test_wrong_peer_key_is_refused(alice: Identity, bob: Identity) -> None:
    mallory = Identity.generate()
    a = ChannelHandshake(alice, peer_public_key=bob.public_key, run_id=RUN, initiator=True)
    fake_b = ChannelHandshake(mallory, peer_public_key=alice.public_key, run_id=RUN, initiator=False)

    with pytest.raises(VerificationError):
        a.finish(fake_b.hello())


def test_mitm_swapping_the_ephemeral_key_is_refused(alice: Identity, bob: Identity) -> None:
    a, b = handshakes(alice, bob)
    outer = msgpack.unpackb(b.hello())
    body = msgpack.unpackb(outer["body"])
    body["eph"] = bytes(32 * [9])
    outer["body"] = msgpack.packb(body, use_bin_type=True)

    with pytest.raises(VerificationError):
        a.finish(msgpack.packb(outer, use_bin_type=True))


@pytest.mark.parametrize("case", ["same-role", "other-run", "reflected"])
def test_hello_bound_to_run_and_role(alice: Identity, bob: Identity, case: str) -> None:
    a, _ = handshakes(alice, bob)
    if case == "same-role":
        peer = ChannelHandshake(bob, peer_public_key=alice.public_key, run_id=RUN, initiator=True)
    elif case == "other-run":
        peer = ChannelHandshake(bob, peer_public_key=alice.public_key, run_id="other@run", initiator=False)
    else:  # alice's own hello sent back to her, with bob's key pinned: refused by key and role
        peer = a

    with pytest.raises(VerificationError):
        a.finish(peer.hello())


def test_failed_finish_leaves_the_handshake_usable(alice: Identity, bob: Identity) -> None:
    a, b = handshakes(alice, bob)
    with pytest.raises(VerificationError):
        a.finish(b"garbage")

    channel = a.finish(b.hello())

    assert b.finish(a.hello()).decrypt(channel.encrypt(b"ok")) == b"ok"


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


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("peer_public_key", {"peer_public_key": b"\x00" * 31}),
        ("run_id", {"run_id": ""}),
        ("ephemeral", {"ephemeral": b"\x00" * 16}),
    ],
)
def test_handshake_validates_arguments(alice: Identity, bob: Identity, field: str, kwargs: dict) -> None:
    args: dict = {"peer_public_key": bob.public_key, "run_id": RUN, "initiator": True}
    args.update(kwargs)

    with pytest.raises(ValueError, match=field):
        ChannelHandshake(alice, **args)
