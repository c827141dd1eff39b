"""Encrypted request/response links over real loopback TCP: the handshake authenticates the right
keys only; tampered, replayed and reordered frames on the session's connection are refused and end
the session; a refused request leaves the link usable; a timed-out or failed link is closed, never
reused; a frame that names no live session, or an oversized hello, is refused before its payload
is read (the TCP server runs the link's gate, as the daemon does); fuzzed hellos are refused one
by one and leave the live session alone. The attacks on sessions (a replayed hello, frames naming
the session from another connection) are in ``test_secure_link_sessions``."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest
import torch

from gossamer.crypto.handshake import Initiator
from gossamer.crypto.identity import Identity
from gossamer.peer.kit.secure_link import (
    LinkMessage,
    RequestRefused,
    SecureLink,
    SecureLinkError,
    pack_body,
    unpack_body,
)
from gossamer.transport.errors import DecodeError, RemoteError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.limits import DEFAULT_LIMITS
from gossamer.transport.tcp import tcp_connect
from tests.peer.kit.secure_link_support import METHOD, RUN, Harness, harness, hello_frame, message
from tests.transport.support import RawClient, frame_head

__all__ = ["harness"]  # the fixture



async def test_round_trip_authenticates_both_sides_and_counts_bytes(harness: Harness) -> None:
    link = await harness.connect()
    try:
        for step in range(3):
            reply = await link.request(message(step), timeout_s=5.0)
            assert reply.step == step and reply.fields == {"from": harness.client.peer_id, "note": "hi"}
            assert torch.equal(reply.tensors["x"], torch.arange(6, dtype=torch.float32).reshape(2, 3) * 2)
            assert torch.equal(reply.tensors["r"], torch.tensor([-(2**62), 5]) * 2)
    finally:
        await link.aclose()
    assert harness.traffic.received["test_echo"] > 3 * (6 * 4 + 2 * 8)
    assert harness.traffic.sent["test_echo"] > 3 * (6 * 4 + 2 * 8)


async def test_client_refuses_a_server_that_is_not_the_expected_key(harness: Harness) -> None:
    with pytest.raises(SecureLinkError, match=r"handshake with peer .* failed"):  # the hello names another key
        await harness.connect(server_key=Identity.generate().public_key)


async def test_server_refuses_a_peer_it_does_not_authorize(harness: Harness) -> None:
    with pytest.raises(SecureLinkError, match="may not talk to this server"):
        await harness.connect(identity=Identity.generate())


async def test_server_refuses_a_hello_signed_by_another_key_than_the_claimed_peer(harness: Harness) -> None:
    impostor = Identity.generate()
    tcp = await tcp_connect("127.0.0.1", harness.tcp.address[1])
    try:
        _, hello = await hello_frame(harness, tcp, impostor, claim=harness.client.peer_id)
        with pytest.raises(RemoteError, match="handshake refused"):
            await tcp.request(hello)
    finally:
        await tcp.aclose()
    assert harness.link_server.sessions == 0


async def _raw_then_link(harness: Harness, send: Callable[[SecureLink, Callable], Awaitable[None]]) -> SecureLink:
    """Open a link, let ``send`` push hand-made frames of its session over the link's own connection
    (the one the session is bound to: what an attacker who can inject into that TCP stream could do)."""
    link = await harness.connect()
    await send(link, link._conn.request)
    return link


async def _assert_session_closed(harness: Harness, link: SecureLink) -> None:
    assert harness.link_server.sessions == 0 and harness.link_server.refused_frames == 1
    with pytest.raises(SecureLinkError, match="unknown or closed session"):
        await link.request(message(9), timeout_s=5.0)
    assert link.closed
    with pytest.raises(SecureLinkError, match="closed"):
        await link.request(message(10), timeout_s=5.0)


async def test_a_replayed_frame_is_refused_and_ends_the_session(harness: Harness) -> None:
    async def replay(link: SecureLink, request) -> None:
        frame = link.seal(message(1))
        await request(frame)
        with pytest.raises(RemoteError, match="tampered, replayed or out of order"):
            await request(frame)

    link = await _raw_then_link(harness, replay)
    await _assert_session_closed(harness, link)


async def test_reordered_frames_are_refused(harness: Harness) -> None:
    async def reorder(link: SecureLink, request) -> None:
        _first, second = link.seal(message(1)), link.seal(message(2))
        with pytest.raises(RemoteError, match="out of order"):
            await request(second)

    link = await _raw_then_link(harness, reorder)
    await _assert_session_closed(harness, link)


@pytest.mark.parametrize("where", ["payload", "step", "op"])
async def test_a_tampered_frame_or_header_is_refused(harness: Harness, where: str) -> None:
    async def tamper(link: SecureLink, request) -> None:
        frame = link.seal(message(3))
        if where == "payload":
            body = bytearray(frame.payload)
            body[len(body) // 2] ^= 1
            frame = Frame(frame.type, frame.header, bytes(body))
        elif where == "step":
            frame = Frame(frame.type, {**frame.header, "step": 4}, frame.payload)
        else:
            frame = Frame(frame.type, {**frame.header, "op": "other"}, frame.payload)
        with pytest.raises(RemoteError, match="tampered"):
            await request(frame)

    link = await _raw_then_link(harness, tamper)
    await _assert_session_closed(harness, link)


async def test_the_client_refuses_a_tampered_reply_and_closes_the_link(harness: Harness) -> None:
    link = await harness.connect()

    def flip(frame: Frame) -> Frame:
        body = bytearray(frame.payload)
        body[-1] ^= 0x80
        return Frame(frame.type, frame.header, bytes(body))

    harness.wrap_reply = flip
    with pytest.raises(SecureLinkError, match="did not verify"):
        await link.request(message(1), timeout_s=5.0)
    assert link.closed


async def test_a_refused_request_keeps_the_link_usable(harness: Harness) -> None:
    link = await harness.connect()
    try:
        with pytest.raises(RequestRefused, match="not today") as refused:
            await link.request(message(1, op="refuse"), timeout_s=5.0)
        assert refused.value.code == "nope" and not link.closed
        assert (await link.request(message(2), timeout_s=5.0)).step == 2
    finally:
        await link.aclose()


@pytest.mark.parametrize("op", ["hello", "confirm", "error"])
async def test_ops_the_link_uses_itself_are_refused_before_anything_is_sent(harness: Harness, op: str) -> None:
    link = await harness.connect()
    with pytest.raises(ValueError, match="reserved"):
        await link.request(message(1, op=op), timeout_s=5.0)
    assert link.closed and harness.link_server.refused_frames == 0


async def test_a_request_that_times_out_closes_the_link(harness: Harness) -> None:
    link = await harness.connect()
    with pytest.raises(SecureLinkError, match="'hang'"):
        await link.request(message(1, op="hang"), timeout_s=0.2)
    assert link.closed


async def test_a_new_hello_from_the_same_peer_replaces_its_session(harness: Harness) -> None:
    first = await harness.connect()
    second = await harness.connect()
    try:
        assert harness.link_server.sessions == 1
        assert (await second.request(message(1), timeout_s=5.0)).step == 1
        with pytest.raises(SecureLinkError, match="unknown or closed session"):
            await first.request(message(1), timeout_s=5.0)
    finally:
        await second.aclose()


@pytest.mark.parametrize("body", [b"", b"\x00\x00\x00\x09abc", b"\x00\x00\x00\x01\x90",
                                  pack_body(LinkMessage("x", 0))[:-1] + b"\x91"])
def test_malformed_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(DecodeError):
        unpack_body("x", 0, body, limits=DEFAULT_LIMITS)


def test_non_finite_tensors_are_refused_at_decoding() -> None:
    body = pack_body(LinkMessage("x", 0, tensors={"a": torch.tensor([1.0, float("nan")])}))
    with pytest.raises(DecodeError, match="NaN"):
        unpack_body("x", 0, body, limits=DEFAULT_LIMITS)


@pytest.mark.parametrize("header", [{"op": "echo", "sid": "0" * 32, "step": 1}, {"op": "hello", "peer": "x"}],
                         ids=["no-session", "hello"])
async def test_a_frame_without_a_live_session_is_refused_before_its_payload_is_read(
        harness: Harness, header: dict) -> None:
    link = await harness.connect()
    raw = await RawClient.connect(harness.tcp.address)
    try:
        await raw.send(frame_head({"method": METHOD, "rid": 1, **header}, 1 << 30) + bytes(4096))
        refused = await raw.read_frame()
        leftover = await raw.read_until_eof()
        still = await link.request(message(1), timeout_s=5.0)
    finally:
        await raw.aclose()
        await link.aclose()

    assert refused.type is FrameType.ERROR and refused.header["code"] == "refused" and leftover == b""
    assert "unknown or closed session" in refused.header["message"] or "a hello of" in refused.header["message"]
    assert still.step == 1 and harness.tcp.budget.peak_bytes < 1 << 20


def fuzzed_hellos(genuine: bytes, client: Identity, server_key: bytes, nonce: bytes) -> list[tuple[dict, bytes]]:
    """(header, payload) pairs a hostile peer might send as a hello: the genuine hello (with a cookie
    of the connection: ``nonce``) with bytes flipped, cut short or extended (seeded), hellos that
    verify but for another run or recipient, the server's own hello reflected, and headers naming
    no, a non-string or an unknown peer."""
    rng = random.Random(0)
    header = {"method": METHOD, "op": "hello", "peer": client.peer_id}
    payloads = []
    for _ in range(40):
        flipped = bytearray(genuine)
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        payloads.append(bytes(flipped))
    payloads += [genuine[:rng.randrange(len(genuine))] for _ in range(10)]
    payloads += [genuine + rng.randbytes(rng.randint(1, 64)) for _ in range(5)]
    payloads += [Initiator(client, peer_public_key=server_key, run_id="other@00112233aabbccdd", nonce=nonce).hello(),
                 Initiator(client, peer_public_key=client.public_key, run_id=RUN, nonce=nonce).hello(),
                 b"", rng.randbytes(200)]
    frames = [(header, payload) for payload in payloads]
    frames += [({**header, "peer": peer}, genuine) for peer in (None, 7, "", Identity.generate().peer_id)]
    return frames


async def test_fuzzed_hellos_are_refused_without_touching_the_live_session(harness: Harness) -> None:
    live = await harness.connect()
    conn = await tcp_connect(*harness.tcp.address)
    refusals = []
    try:
        handshake, hello = await hello_frame(harness, conn)
        genuine = bytes(hello.payload)
        for header, payload in fuzzed_hellos(genuine, harness.client, harness.server_identity.public_key,
                                             handshake._nonce):
            with pytest.raises(RemoteError) as refused:
                await conn.request(Frame(FrameType.REQUEST, dict(header), payload), timeout_s=5.0)
            refusals.append(str(refused.value))
        still = await live.request(message(2), timeout_s=5.0)
    finally:
        await conn.aclose()
        await live.aclose()

    assert all("secure link:" in text for text in refusals), [t for t in refusals if "secure link:" not in t]
    assert harness.link_server.sessions == 1 and still.step == 2
