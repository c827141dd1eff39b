"""Attacks on a live secure-link session by someone who sees the traffic (every hello, sid and frame
goes over the network) but holds no key, each against the real SecureLinkServer on 127.0.0.1: a
captured hello replayed (refused: its cookie is another connection's), its confirmation replayed,
frames naming the live session's clear-text id from another connection (junk, or the session's own
captured ciphertext), and a handshake finished from another connection than the one it began on.
After each, the live link keeps working and the server still holds exactly its one session.
(Before sessions were bound to their connection and confirmed, the replayed hello and the junk
frame each ended the live session.) Replay floods: ``test_secure_link_replay``."""

from __future__ import annotations

import pytest

from gossamer.peer.kit.secure_link import CONFIRM, HELLO, SecureLink
from gossamer.transport.errors import RemoteError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import TcpConnection, tcp_connect
from tests.peer.kit.secure_link_support import METHOD, Harness, harness, hello_frame, message

__all__ = ["harness"]  # the fixture


def captured(harness: Harness, op: str) -> list[Frame]:
    """The frames with ``op`` the server received so far, in order (what a wire observer saw)."""
    return [frame for _, frame in harness.received if frame.header.get("op") == op]


async def assert_live(harness: Harness, link: SecureLink, step: int) -> None:
    reply = await link.request(message(step), timeout_s=5.0)
    assert reply.step == step and reply.fields["from"] == harness.client.peer_id
    assert harness.link_server.sessions == 1 and not link.closed


async def attacker(harness: Harness) -> TcpConnection:
    return await tcp_connect(*harness.tcp.address)


async def test_a_replayed_hello_and_confirmation_do_not_touch_the_live_session(harness: Harness) -> None:
    live = await harness.connect()
    await assert_live(harness, live, 1)
    [hello], [confirmation] = captured(harness, HELLO), captured(harness, CONFIRM)
    conn = await attacker(harness)
    try:
        with pytest.raises(RemoteError, match="no cookie of this connection"):
            await conn.request(hello, timeout_s=5.0)
        assert harness.link_server.pending == 0 and harness.link_server.sessions == 1
        await assert_live(harness, live, 2)
        with pytest.raises(RemoteError, match="no such handshake"):  # the sid is a session's now
            await conn.request(confirmation, timeout_s=5.0)
    finally:
        await conn.aclose()
    await assert_live(harness, live, 3)
    assert harness.link_server.pending == 0 and harness.link_server.refused_frames == 0
    assert harness.link_server.refused_hellos == 1
    await live.aclose()


@pytest.mark.parametrize("kind", ["junk", "captured-ciphertext"])
async def test_frames_naming_the_live_session_from_another_connection_are_dropped(harness: Harness,
                                                                                  kind: str) -> None:
    live = await harness.connect()
    await assert_live(harness, live, 1)
    [request] = [frame for _, frame in harness.received if frame.header.get("op") == "echo"]
    payload = bytes(len(request.payload)) if kind == "junk" else request.payload
    conn = await attacker(harness)
    try:
        for step in (1, 2):
            forged = Frame(FrameType.REQUEST, {**request.header, "step": step}, payload)
            with pytest.raises(RemoteError, match="belongs to another connection"):
                await conn.request(forged, timeout_s=5.0)
    finally:
        await conn.aclose()
    assert harness.link_server.foreign_frames == 2 and harness.link_server.refused_frames == 0
    await assert_live(harness, live, 2)
    await live.aclose()


async def test_a_handshake_is_finished_only_on_the_connection_it_began_on(harness: Harness) -> None:
    live = await harness.connect()
    first, second = await attacker(harness), await attacker(harness)
    try:
        handshake, hello = await hello_frame(harness, first)
        answer = await first.request(hello)
        confirm = Frame(FrameType.REQUEST, {"method": METHOD, "op": CONFIRM, "sid": answer.header["sid"]},
                        handshake.confirm(bytes(answer.payload)))
        with pytest.raises(RemoteError, match="belongs to another connection"):
            await second.request(confirm, timeout_s=5.0)
        await assert_live(harness, live, 1)  # a pending handshake is no session: the old one stands
        ack = await first.request(confirm, timeout_s=5.0)
        handshake.finish(bytes(ack.payload))
    finally:
        await first.aclose()
        await second.aclose()
    assert harness.link_server.sessions == 1 and harness.link_server.foreign_frames == 1
    await live.aclose()  # the completed handshake replaced the live session, as a reconnect does
