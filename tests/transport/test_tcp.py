"""TcpServer / tcp_connect over real loopback sockets: requests, one-way streams, closing, no leaks."""

from __future__ import annotations

import asyncio
import socket

import pytest
import torch

from gossamer.transport.codec import decode_tensor_message, encode_tensor_message
from gossamer.transport.errors import ConnectionClosed, RemoteError, TransportTimeout
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.header import pack_header
from gossamer.transport.tcp import ConnectFailed, HandlerError, TcpConfig, TcpServer, tcp_connect
from tests.transport.support import FAST, WAIT_S, TcpNet, echo

# --- fixtures and helpers -------------------------------------------------------------------




def tensor_frame(tensors: dict[str, torch.Tensor], frame_type: FrameType = FrameType.REQUEST) -> Frame:
    header, buffers = encode_tensor_message(tensors)
    return Frame(frame_type, {"tensors": header}, buffers)


def frame_tensors(frame: Frame) -> dict[str, torch.Tensor]:
    return decode_tensor_message(frame.header["tensors"], frame.payload)


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"idle_timeout_s": 0}, "idle_timeout_s"),
        ({"read_timeout_s": float("inf")}, "read_timeout_s"),
        ({"connect_timeout_s": -1.0}, "connect_timeout_s"),
        ({"max_connections": 0}, "max_connections"),
        ({"queue_maxsize": 1.5}, "queue_maxsize"),
        ({"socket_buffer_bytes": True}, "socket_buffer_bytes"),
    ],
)
def test_config_refuses_bad_values_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TcpConfig(**kwargs)


def test_config_refuses_non_limits() -> None:
    with pytest.raises(TypeError, match="limits"):
        TcpConfig(limits={"max_header_bytes": 10})  # type: ignore[arg-type]


# --- requests -------------------------------------------------------------------------------


async def test_request_round_trip_with_tensors(net: TcpNet) -> None:
    async def add_one(frame: Frame, info) -> Frame:
        tensors = frame_tensors(frame)
        return tensor_frame({name: t + 1 for name, t in tensors.items()}, FrameType.RESPONSE)

    server = await net.server(add_one)
    conn = await net.connect(server)
    big = torch.arange(16 * 1024 * 1024, dtype=torch.float32)  # 64 MiB
    small = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)

    reply = await conn.request(tensor_frame({"big": big, "small": small}))

    out = frame_tensors(reply)
    assert reply.type is FrameType.RESPONSE
    assert torch.equal(out["big"], big + 1) and torch.equal(out["small"], small + 1)
    assert conn.stats.bytes_out > big.nbytes and conn.stats.bytes_in > big.nbytes
    assert server.stats.frames_in == 1 and server.stats.frames_out == 1


async def test_concurrent_requests_are_matched_to_their_responses(net: TcpNet) -> None:
    first_waits = asyncio.Event()

    async def handler(frame: Frame, info) -> Frame:
        if frame.header["x"] == 0:
            await asyncio.wait_for(first_waits.wait(), WAIT_S)  # answered only after a later one
        else:
            first_waits.set()
        return await echo(frame, info)

    server = await net.server(handler)
    conn = await net.connect(server)

    replies = await asyncio.gather(
        *(conn.request(Frame(FrameType.REQUEST, {"x": i}, b"p%d" % i)) for i in range(12)))

    assert [reply.header["echo"] for reply in replies] == list(range(12))
    assert [bytes(reply.payload) for reply in replies] == [b"p%d" % i for i in range(12)]


async def test_empty_and_scattered_payloads(net: TcpNet) -> None:
    server = await net.server(echo)
    conn = await net.connect(server)

    empty = await conn.request(Frame(FrameType.REQUEST, {"x": 1}))
    scattered = await conn.request(Frame(FrameType.REQUEST, {"x": 2}, [b"ab", bytearray(b"cd"), memoryview(b"e")]))

    assert bytes(empty.payload) == b""
    assert bytes(scattered.payload) == b"abcde"


async def test_handler_errors_become_remote_errors_and_the_connection_keeps_working(net: TcpNet, server_log) -> None:
    async def handler(frame: Frame, info) -> Frame | None:
        op = frame.header["op"]
        if op == "refuse":
            raise HandlerError("no such block 7")
        if op == "crash":
            raise ZeroDivisionError("secret detail")
        if op == "decode":
            decode_tensor_message(pack_header({"tensors": [{"name": 1}]}), b"")
        return None

    crashes = server_log("handler failed")
    server = await net.server(handler)
    conn = await net.connect(server)

    with pytest.raises(RemoteError, match="no such block 7"):
        await conn.request(Frame(FrameType.REQUEST, {"op": "refuse"}))
    with pytest.raises(RemoteError, match="internal error") as crash:
        await conn.request(Frame(FrameType.REQUEST, {"op": "crash"}))
    with pytest.raises(RemoteError, match="lacks field"):
        await conn.request(Frame(FrameType.REQUEST, {"op": "decode"}))
    reply = await conn.request(Frame(FrameType.REQUEST, {"op": "fine"}))

    assert "secret detail" not in str(crash.value)
    assert crashes.seen.is_set()
    assert reply.type is FrameType.RESPONSE and bytes(reply.payload) == b""


async def test_request_timeout_leaves_the_connection_usable(net: TcpNet) -> None:
    gate = asyncio.Event()

    async def handler(frame: Frame, info) -> Frame:
        if frame.header["x"] == "slow":
            await asyncio.wait_for(gate.wait(), WAIT_S)
        return await echo(frame, info)

    server = await net.server(handler)
    conn = await net.connect(server)

    with pytest.raises(TransportTimeout):
        await conn.request(Frame(FrameType.REQUEST, {"x": "slow"}), timeout_s=0.2)
    gate.set()
    reply = await conn.request(Frame(FrameType.REQUEST, {"x": "next"}))

    assert reply.header["echo"] == "next"


async def test_connect_refused_is_connect_failed(no_leaks: None) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # bound, not listening: connecting is refused
    try:
        with pytest.raises(ConnectFailed):
            await tcp_connect(*holder.getsockname(), config=FAST)
    finally:
        holder.close()


# --- one-way streams ------------------------------------------------------------------------


async def test_oneway_stream_is_bounded_by_backpressure(net: TcpNet) -> None:
    config = TcpConfig(queue_maxsize=2, socket_buffer_bytes=64 * 1024, read_timeout_s=WAIT_S)
    count, frame_bytes = 30, 256 * 1024
    gate, first, all_in = asyncio.Event(), asyncio.Event(), asyncio.Event()
    received: list[int] = []
    sent = 0

    async def slow_handler(frame: Frame, info) -> None:
        received.append(frame.header["i"])
        first.set()
        await asyncio.wait_for(gate.wait(), WAIT_S)
        if len(received) == count:
            all_in.set()

    async def sender() -> None:
        nonlocal sent
        for i in range(count):
            await conn.send(Frame(FrameType.ONEWAY, {"i": i}, bytes(frame_bytes)))
            sent += 1

    server = await net.server(slow_handler, config)
    conn = await net.connect(server, config)
    task = asyncio.create_task(sender())
    await asyncio.wait_for(first.wait(), WAIT_S)
    done, _ = await asyncio.wait({task}, timeout=0.5)
    sent_while_blocked = sent
    gate.set()
    await asyncio.wait_for(task, WAIT_S)
    await asyncio.wait_for(all_in.wait(), WAIT_S)

    assert not done, "the sender was never pushed back"
    assert sent_while_blocked <= config.queue_maxsize + 6  # handler + queue + reader + kernel buffers
    assert received == list(range(count))
    assert server.stats.oneway_queue_peak <= config.queue_maxsize


# --- closing --------------------------------------------------------------------------------


async def test_server_aclose_mid_transfer_fails_the_client_cleanly(no_leaks: None) -> None:
    receiving = asyncio.Event()

    def payload_buffer(nbytes: int) -> bytearray:
        receiving.set()
        return bytearray(nbytes)

    server = await TcpServer.create(echo, config=FAST, payload_buffer=payload_buffer)
    conn = await tcp_connect(*server.address, config=FAST)
    request = asyncio.create_task(conn.request(Frame(FrameType.REQUEST, {}, bytes(64 << 20))))
    await asyncio.wait_for(receiving.wait(), WAIT_S)

    await server.aclose()
    await server.aclose()
    with pytest.raises(ConnectionClosed):
        await request
    await conn.aclose()

    assert server.stats.connections_open == 0


async def test_client_aclose_fails_pending_requests(net: TcpNet) -> None:
    started = asyncio.Event()

    async def never_answers(frame: Frame, info) -> None:
        started.set()
        await asyncio.Event().wait()

    server = await net.server(never_answers)
    conn = await net.connect(server)
    request = asyncio.create_task(conn.request(Frame(FrameType.REQUEST, {})))
    await asyncio.wait_for(started.wait(), WAIT_S)

    await conn.aclose()
    await conn.aclose()

    with pytest.raises(ConnectionClosed):
        await request
    with pytest.raises(ConnectionClosed):
        await conn.request(Frame(FrameType.REQUEST, {}))


async def test_requests_after_the_server_went_away_raise(net: TcpNet) -> None:
    server = await net.server(echo)
    conn = await net.connect(server)
    await conn.request(Frame(FrameType.REQUEST, {"x": 1}))

    await server.aclose()
    with pytest.raises(ConnectionClosed):
        await conn.request(Frame(FrameType.REQUEST, {"x": 2}))
