"""The channel handshake: right keys only, freshness and key confirmation on both sides, a
replayed hello or a leaked old session opens nothing, messages are bound to run, recipient,
transcript and their place in the exchange."""

from __future__ import annotations

import msgpack
import pytest

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.handshake import Initiator, Responder
from gossamer.crypto.identity import Identity

RUN = "tl@d75a9801"


@pytest.fixture
def alice() -> Identity:
    return Identity.generate()


@pytest.fixture
def bob() -> Identity:
    return Identity.generate()


def pair(alice: Identity, bob: Identity, run: str = RUN) -> tuple[Initiator, Responder]:
    return (Initiator(alice, peer_public_key=bob.public_key, run_id=run),
            Responder(bob, peer_public_key=alice.public_key, run_id=run))


def test_the_exchange_gives_both_sides_one_channel_past_the_confirmation(alice: Identity, bob: Identity) -> None:
    a, b = pair(alice, bob)
    channel_b, ack = b.confirm(a.confirm(b.answer(a.hello())))
    channel_a = a.finish(ack)

    assert (channel_a.frames_sent, channel_a.frames_received) == (1, 1) == (channel_b.frames_sent,
                                                                            channel_b.frames_received)
    assert channel_b.decrypt(channel_a.encrypt(b"share", b"ad"), b"ad") == b"share"
    assert channel_a.decrypt(channel_b.encrypt(b"sum")) == b"sum"


def test_a_replayed_hello_gets_an_answer_nobody_can_confirm(alice: Identity, bob: Identity) -> None:
    """The attack of a captured hello: the responder answers with a fresh nonce and ephemeral,
    and neither the genuine confirmation of the first exchange nor junk verifies (a leaked
    ephemeral: the next test)."""
    a, first = pair(alice, bob)
    hello = a.hello()
    genuine = a.confirm(first.answer(hello))
    first.confirm(genuine)

    replayed = Responder(bob, peer_public_key=alice.public_key, run_id=RUN)
    replayed.answer(hello)  # the hello alone verifies: it proves nothing fresh
    with pytest.raises(VerificationError):
        replayed.confirm(genuine)
    with pytest.raises(VerificationError):
        replayed.confirm(b"\x00" * len(genuine))


def test_a_leaked_ephemeral_cannot_confirm_without_the_identity_key(alice: Identity, bob: Identity) -> None:
    """Mallory holds alice's ephemeral secret (a leaked session) and replays her hello: she can
    derive the new keys, but cannot sign the new transcript as alice."""
    mallory = Identity.generate()
    ephemeral = bytes(range(32))
    hello = Initiator(alice, peer_public_key=bob.public_key, run_id=RUN, ephemeral=ephemeral).hello()
    b = Responder(bob, peer_public_key=alice.public_key, run_id=RUN)
    answer = b.answer(hello)
    forger = Initiator(mallory, peer_public_key=bob.public_key, run_id=RUN, ephemeral=ephemeral)
    forger._hello = hello  # alice's hello and ephemeral secret; the signing key is mallory's

    with pytest.raises(VerificationError):
        b.confirm(forger.confirm(answer))


def test_the_initiator_refuses_an_answer_to_another_hello(alice: Identity, bob: Identity) -> None:
    a, b = pair(alice, bob)
    other, _ = pair(alice, bob)
    answer_to_other = b.answer(other.hello())

    with pytest.raises(VerificationError):
        a.confirm(answer_to_other)


def test_wrong_keys_are_refused_both_ways(alice: Identity, bob: Identity) -> None:
    mallory = Identity.generate()
    a, _ = pair(alice, bob)
    fake_b = Responder(mallory, peer_public_key=alice.public_key, run_id=RUN)
    with pytest.raises(VerificationError):
        a.confirm(fake_b.answer(a.hello()))
    b = Responder(bob, peer_public_key=alice.public_key, run_id=RUN)
    with pytest.raises(VerificationError):
        b.answer(Initiator(mallory, peer_public_key=bob.public_key, run_id=RUN).hello())


def test_mitm_swapping_the_ephemeral_key_is_refused(alice: Identity, bob: Identity) -> None:
    a, b = pair(alice, bob)
    outer = msgpack.unpackb(b.answer(a.hello()))
    body = msgpack.unpackb(outer["body"])
    body["eph"] = bytes(32 * [9])
    outer["body"] = msgpack.packb(body, use_bin_type=True)

    with pytest.raises(VerificationError):
        a.confirm(msgpack.packb(outer, use_bin_type=True))


@pytest.mark.parametrize("case", ["other-run", "other-recipient", "reflected-hello", "answer-as-hello"])
def test_messages_are_bound_to_run_recipient_and_place(alice: Identity, bob: Identity, case: str) -> None:
    carol = Identity.generate()
    b = Responder(bob, peer_public_key=alice.public_key, run_id=RUN)
    if case == "other-run":
        message = Initiator(alice, peer_public_key=bob.public_key, run_id="other@run").hello()
    elif case == "other-recipient":  # alice's hello to carol, relayed to bob
        message = Initiator(alice, peer_public_key=carol.public_key, run_id=RUN).hello()
    elif case == "reflected-hello":  # bob's own hello sent back to him
        message = Initiator(bob, peer_public_key=alice.public_key, run_id=RUN).hello()
    else:
        a2 = Initiator(bob, peer_public_key=alice.public_key, run_id=RUN)
        message = Responder(alice, peer_public_key=bob.public_key, run_id=RUN).answer(a2.hello())

    with pytest.raises(VerificationError):
        b.answer(message)


def test_the_ack_proves_the_responder_holds_the_keys(alice: Identity, bob: Identity) -> None:
    a, b = pair(alice, bob)
    confirmation = a.confirm(b.answer(a.hello()))
    with pytest.raises(VerificationError):
        a.finish(confirmation)  # the initiator's own frame is no ack
    channel_b, ack = b.confirm(confirmation)
    with pytest.raises(VerificationError):
        a.finish(ack[:-1])
    assert a.finish(ack).decrypt(channel_b.encrypt(b"x")) == b"x"  # a failed step leaves the handshake usable


def test_steps_out_of_order_are_refused(alice: Identity, bob: Identity) -> None:
    a, b = pair(alice, bob)
    with pytest.raises(ValueError, match="before confirm"):
        a.finish(b"")
    with pytest.raises(ValueError, match="before answer"):
        b.confirm(b"")


@pytest.mark.parametrize(("field", "kwargs"), [("peer_public_key", {"peer_public_key": b"\x00" * 31}),
                                               ("run_id", {"run_id": ""}),
                                               ("ephemeral", {"ephemeral": b"\x00" * 16}),
                                               ("nonce", {"nonce": b"\x00" * 8})])
def test_handshake_validates_arguments(alice: Identity, bob: Identity, field: str, kwargs: dict) -> None:
    args: dict = {"peer_public_key": bob.public_key, "run_id": RUN, **kwargs}
    for side in (Initiator, Responder):
        with pytest.raises(ValueError, match=field):
            side(alice, **args)
