"""Replayed hellos against a real SecureLinkServer on 127.0.0.1 (issue 30, item 10): an old hello
replayed 300 times from several connections while an honest handshake is pending leaves it to
complete (before: 256 replays evicted it, "no such handshake") and costs no signature check; a
hello whose cookie is older than the window is refused (on the test's clock); pending handshakes
are bounded per connection and per peer, and expire."""

from __future__ import annotations

import pytest

from gossamer.peer.kit.secure_link import CONFIRM
from gossamer.peer.kit.secure_link.server import HELLO_WINDOW_S, MAX_PENDING_PER_PEER
from gossamer.transport.errors import RemoteError
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import TcpConnection, tcp_connect
from tests.peer.kit.secure_link_support import METHOD, Harness, harness, hello_frame, message

__all__ = ["harness"]  # the fixture
REPLAYS = 300


async def confirm(conn: TcpConnection, handshake, answer: Frame) -> Frame:
    return await conn.request(Frame(FrameType.REQUEST, {"method": METHOD, "op": CONFIRM, "sid": answer.header["sid"]},
                                    handshake.confirm(bytes(answer.payload))), timeout_s=5.0)


async def test_an_old_hello_replayed_300_times_leaves_the_honest_handshake_to_complete(harness: Harness) -> None:
    old = await harness.connect()  # a link set up earlier: its hello went over the wire
    [(_, captured)] = [(cid, f) for cid, f in harness.received if f.header.get("op") == "hello"]
    await old.aclose()
    honest = await tcp_connect(*harness.tcp.address)
    attackers = [await tcp_connect(*harness.tcp.address) for _ in range(3)]
    try:
        handshake, hello = await hello_frame(harness, honest)
        answer = await honest.request(hello, timeout_s=5.0)  # pending now
        refusals = set()
        for i in range(REPLAYS):
            with pytest.raises(RemoteError) as refused:
                await attackers[i % 3].request(captured if i % 2 else hello, timeout_s=5.0)  # old, and in flight
            refusals.add(str(refused.value).split(";")[0])
        ack = await confirm(honest, handshake, answer)
        channel = handshake.finish(bytes(ack.payload))
    finally:
        for conn in (honest, *attackers):
            await conn.aclose()

    assert channel is not None and ack.header["sid"] == answer.header["sid"]
    assert refusals == {"secure link: the hello's nonce is no cookie of this connection (replayed?)"}
    assert harness.link_server.refused_hellos == REPLAYS  # each refused before its signature was checked
    assert harness.link_server.sessions == 1 and harness.link_server.pending == 0


async def test_a_hello_whose_cookie_is_older_than_the_window_is_refused(harness: Harness) -> None:
    conn = await tcp_connect(*harness.tcp.address)
    try:
        _, late = await hello_frame(harness, conn)
        harness.clock.now += HELLO_WINDOW_S + 1
        with pytest.raises(RemoteError, match="stale hello"):
            await conn.request(late, timeout_s=5.0)
        handshake, fresh = await hello_frame(harness, conn)  # a new cookie: the link is set up
        answer = await conn.request(fresh, timeout_s=5.0)
        harness.clock.now += HELLO_WINDOW_S - 1  # the cookie is fresh enough: the confirmation is in time
        handshake.finish(bytes((await confirm(conn, handshake, answer)).payload))
    finally:
        await conn.aclose()
    assert harness.link_server.refused_hellos == 1 and harness.link_server.sessions == 1


async def test_pending_handshakes_are_bounded_per_connection_and_per_peer_and_expire(harness: Harness) -> None:
    live = await harness.connect()
    conns = [await tcp_connect(*harness.tcp.address) for _ in range(MAX_PENDING_PER_PEER + 3)]
    try:
        again = [(await hello_frame(harness, conns[0]))[1] for _ in range(3)]
        for hello in again:
            await conns[0].request(hello, timeout_s=5.0)
        assert harness.link_server.pending == 1  # a new hello on a connection replaces its pending one
        started = []
        for conn in conns[1:]:
            handshake, hello = await hello_frame(harness, conn)
            started.append((conn, handshake, await conn.request(hello, timeout_s=5.0)))
        assert harness.link_server.pending == MAX_PENDING_PER_PEER  # the peer's oldest were dropped
        with pytest.raises(RemoteError, match="no such handshake"):
            await confirm(*started[0])
        conn, handshake, answer = started[-1]
        harness.clock.now += HELLO_WINDOW_S + 1
        with pytest.raises(RemoteError, match="no such handshake"):  # expired
            await confirm(conn, handshake, answer)
        assert harness.link_server.pending == 0
        reply = await live.request(message(1), timeout_s=5.0)  # sessions are never dropped for pendings
    finally:
        for conn in conns:
            await conn.aclose()
        await live.aclose()
    assert reply.step == 1 and harness.link_server.sessions == 1
