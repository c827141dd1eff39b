"""TcpServer / tcp_connect against hostile and broken peers: idle and stalled clients, peers
vanishing mid-frame, bad bytes, the connection cap. Each test also checks that nothing leaks."""

from __future__ import annotations

import asyncio
import pickle
import socket
import time

import pytest

from gossamer.transport.errors import ConnectionClosed, Overloaded
from gossamer.transport.frames import MAGIC, PREFIX, Frame, FrameType, decode_frame, encode_frame
from gossamer.transport.header import pack_header
from gossamer.transport.limits import Limits
from gossamer.transport.tcp import TcpConfig, tcp_connect
from tests.transport.support import FAST, WAIT_S, TcpNet, echo

# --- hostile and broken peers ---------------------------------------------------------------


async def test_silent_client_is_cut_after_first_frame_timeout_while_others_are_served(net: TcpNet) -> None:
    config = TcpConfig(first_frame_timeout_s=0.3, idle_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    server = await net.server(echo, config)
    started = time.monotonic()
    silent = await net.raw(server)
    conn = await net.connect(server, config)

    served = await conn.request(Frame(FrameType.REQUEST, {"x": "during"}))
    leftover = await silent.read_until_eof()
    elapsed_s = time.monotonic() - started

    assert served.header["echo"] == "during"
    assert leftover == b""
    assert elapsed_s >= config.first_frame_timeout_s


async def test_slow_handler_does_not_count_as_idle(net: TcpNet) -> None:
    config = TcpConfig(idle_timeout_s=0.1, read_timeout_s=WAIT_S)

    async def slow(frame: Frame, info) -> Frame:
        await asyncio.sleep(0.4)  # the handler's own work, longer than the idle timeout
        return await echo(frame, info)

    server = await net.server(slow, config)
    conn = await net.connect(server, config)

    reply = await conn.request(Frame(FrameType.REQUEST, {"x": "slow"}))

    assert reply.header["echo"] == "slow"


async def test_client_stalling_mid_frame_is_cut_after_read_timeout(net: TcpNet) -> None:
    config = TcpConfig(idle_timeout_s=WAIT_S, read_timeout_s=0.3)
    server = await net.server(echo, config)
    raw = await net.raw(server)
    header = pack_header({"x": 1})
    started = time.monotonic()

    await raw.send(PREFIX.pack(MAGIC, 1, 1, len(header), 10) + header[:2])
    leftover = await raw.read_until_eof()

    assert leftover == b""
    assert time.monotonic() - started >= config.read_timeout_s


@pytest.mark.parametrize(
    ("cut", "message"),
    [(10, "after 10 of 18 prefix bytes"), (18 + 3, "after 3 of 8 header bytes"),
     (18 + 8 + 100, "after 100 of 1000 payload bytes")],
)
async def test_client_disconnecting_mid_frame(net: TcpNet, server_log, cut: int, message: str) -> None:
    header = pack_header({"x": "abcd"})
    frame = PREFIX.pack(MAGIC, 1, 1, len(header), 1000) + header + bytes(1000)
    closed = server_log("peer closed the connection")
    server = await net.server(echo)
    raw = await net.raw(server)

    await raw.send(frame[:cut])
    await raw.aclose()
    await asyncio.wait_for(closed.seen.wait(), WAIT_S)
    conn = await net.connect(server)
    reply = await conn.request(Frame(FrameType.REQUEST, {"x": "still serving"}))

    assert len(header) == 8
    assert any(message in line for line in closed.messages), closed.messages
    assert reply.header["echo"] == "still serving"


async def test_server_disconnecting_mid_response_fails_the_request(no_leaks: None) -> None:
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)

    async def broken_server() -> None:
        sock, _ = await loop.sock_accept(listener)
        with sock:
            await loop.sock_recv(sock, 65536)
            header = pack_header({"rid": 1})
            await loop.sock_sendall(sock, PREFIX.pack(MAGIC, 1, 2, len(header), 1000) + header + bytes(100))

    peer = asyncio.create_task(broken_server())
    try:
        conn = await tcp_connect(*listener.getsockname(), config=FAST)
        with pytest.raises(ConnectionClosed, match="after 100 of 1000 payload bytes"):
            await conn.request(Frame(FrameType.REQUEST, {}))
        await conn.aclose()
        await peer
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (PREFIX.pack(MAGIC, 1, 1, 2**32 - 1, 0), "header_len"),
        (PREFIX.pack(MAGIC, 1, 1, 8, 2**64 - 1), "payload_len"),
        (PREFIX.pack(MAGIC, 1, 1, 10_000, 0) + pack_header({"x": "y" * 9990}), "header_len"),
        (pickle.dumps({"evil": list(range(100))}), "magic"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "magic"),
        (PREFIX.pack(MAGIC, 7, 1, 0, 0), "version"),
        (PREFIX.pack(MAGIC, 1, 1, 3, 0) + pack_header([1, 2]), "map"),
        (b"".join(encode_frame(Frame(FrameType.RESPONSE, {"rid": 1}))), "unexpected RESPONSE"),
    ],
)
async def test_bad_bytes_get_an_error_frame_and_the_connection_is_closed(net: TcpNet, data: bytes,
                                                                         message: str) -> None:
    config = TcpConfig(limits=Limits(max_header_bytes=4096), idle_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    server = await net.server(echo, config)
    raw = await net.raw(server)
    conn = await net.connect(server, config)

    await raw.send(data)
    error = decode_frame(await raw.read_until_eof())
    reply = await conn.request(Frame(FrameType.REQUEST, {"x": "fine"}))

    assert error.type is FrameType.ERROR and error.header["code"] == "decode"
    assert message in error.header["message"]
    assert reply.header["echo"] == "fine"


async def test_connection_cap_refuses_with_overloaded(net: TcpNet) -> None:
    config = TcpConfig(max_connections=2, idle_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    server = await net.server(echo, config)
    first, second = await net.connect(server, config), await net.connect(server, config)
    await first.request(Frame(FrameType.REQUEST, {"x": 1}))
    await second.request(Frame(FrameType.REQUEST, {"x": 2}))

    third = await net.connect(server, config)
    with pytest.raises(Overloaded, match="overloaded"):
        await third.request(Frame(FrameType.REQUEST, {"x": 3}))
    still = await first.request(Frame(FrameType.REQUEST, {"x": 4}))

    assert still.header["echo"] == 4
    assert server.stats.connections_open == 2
