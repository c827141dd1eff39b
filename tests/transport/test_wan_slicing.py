"""WanProxy with ``slice_bytes``: every byte its own write, and gossamer's HTTP and TCP transports
still get whole, correct messages when their frames arrive a byte at a time."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import pytest
import torch
from aiohttp import web

from gossamer.transport.codec import decode_tensor_message, encode_tensor_message
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer, read_tensors, stream_tensors
from gossamer.transport.limits import Limits
from gossamer.transport.tcp import TcpConfig, TcpServer, tcp_connect
from gossamer_harness.wan import LinkProfile, WanProxy

WAIT_S = 240.0
"""Upper bound on any wait here, reached only when something is broken: through one-byte slices a
few kB are thousands of writes, which at load 40 on 2 cores took longer than the 5-10 s of FAST."""
PATIENT = TcpConfig(idle_timeout_s=WAIT_S, read_timeout_s=WAIT_S, request_timeout_s=WAIT_S)

SLICED = LinkProfile(slice_bytes=1)


class Opened(contextlib.AsyncExitStack):
    """What a test opened, closed at its end (last first)."""

    def add(self, thing):
        self.push_async_callback(thing.aclose)
        return thing


@pytest.fixture
async def opened(no_leaks: None) -> AsyncIterator[Opened]:
    async with Opened() as stack:
        yield stack


async def sliced_proxy(opened: Opened, port: int) -> WanProxy:
    return opened.add(await WanProxy.create("127.0.0.1", port, up=SLICED))


def tensors(seed: int) -> dict[str, torch.Tensor]:
    """About 3 kB of tensors: a few thousand one-byte writes each way."""
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(24, 24, generator=generator), "step": torch.arange(50, dtype=torch.int64)}


async def test_an_http_tensor_upload_and_download_through_one_byte_slices(opened: Opened) -> None:
    stored: dict[str, torch.Tensor] = {}
    limits = Limits(max_payload_bytes=1 << 20)

    async def put(request: web.Request) -> web.Response:
        received, _ = await read_tensors(request, limits=limits, require_finite=True)
        stored.update(received)
        return web.json_response({"stored": sorted(received)})

    async def get(request: web.Request) -> web.StreamResponse:
        return await stream_tensors(request, {name: t * 2 for name, t in stored.items()}, {"round": "7"})

    app = web.Application()
    app.router.add_put("/tensors", put)
    app.router.add_get("/tensors", get)
    server = opened.add(await HttpServer.create(app, config=HttpConfig(limits=limits)))
    proxy = await sliced_proxy(opened, server.address[1])
    client = opened.add(await HttpClient.create(config=HttpConfig(limits=limits)))
    host, port = proxy.address
    url = f"http://{host}:{port}/tensors"
    sent = tensors(1)

    answer = await asyncio.wait_for(client.put_tensors(url, sent), WAIT_S)
    back, metadata = await asyncio.wait_for(client.get_tensors(url), WAIT_S)
    stats = proxy.stats

    assert answer == {"stored": ["step", "w"]}
    assert all(torch.equal(stored[name], sent[name]) for name in sent)
    assert metadata == {"round": "7"} and all(torch.equal(back[name], 2 * sent[name]) for name in sent)
    body_bytes = sum(t.nbytes for t in sent.values())
    assert stats.up.bytes_forwarded > body_bytes and stats.down.bytes_forwarded > body_bytes
    assert (stats.up.writes, stats.down.writes) == (stats.up.bytes_forwarded, stats.down.bytes_forwarded)


async def test_tcp_requests_through_one_byte_slices_get_their_own_answers(opened: Opened) -> None:
    async def add_one(frame: Frame, info) -> Frame:
        received = decode_tensor_message(frame.header["tensors"], frame.payload)
        header, buffers = encode_tensor_message({name: t + 1 for name, t in received.items()})
        return Frame(FrameType.RESPONSE, {"tensors": header, "x": frame.header["x"]}, buffers)

    server = opened.add(await TcpServer.create(add_one, config=PATIENT))
    proxy = await sliced_proxy(opened, server.address[1])
    conn = opened.add(await tcp_connect(*proxy.address, config=PATIENT))
    requests = [tensors(seed) for seed in range(3)]

    async def ask(x: int) -> Frame:
        header, buffers = encode_tensor_message(requests[x])
        return await conn.request(Frame(FrameType.REQUEST, {"tensors": header, "x": x}, buffers))

    replies = await asyncio.wait_for(asyncio.gather(*(ask(x) for x in range(3))), WAIT_S)
    stats = proxy.stats

    for x, reply in enumerate(replies):
        got = decode_tensor_message(reply.header["tensors"], reply.payload)
        assert reply.header["x"] == x
        assert all(torch.equal(got[name], requests[x][name] + 1) for name in requests[x])
    assert stats.up.bytes_forwarded == conn.stats.bytes_out and stats.down.bytes_forwarded == conn.stats.bytes_in
    assert (stats.up.writes, stats.down.writes) == (stats.up.bytes_forwarded, stats.down.bytes_forwarded)


class Sink:
    """A server that reads one connection to EOF (or a reset) and records the size of every read."""

    def __init__(self) -> None:
        self.reads: list[int] = []
        self.done = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                self.reads.append(len(data))
        except ConnectionError:
            pass  # a reset ends the connection as EOF does; the test reads the proxy's counters
        finally:
            writer.close()
            self.done.set()


@pytest.mark.parametrize("slice_bytes", [None, 1, 100])
async def test_a_sliced_link_writes_each_slice_separately(opened: Opened, slice_bytes: int | None) -> None:
    sink = Sink()
    server = await asyncio.start_server(sink.handle, "127.0.0.1", 0)
    payload = random.Random(5).randbytes(4000)
    proxy = opened.add(await WanProxy.create("127.0.0.1", server.sockets[0].getsockname()[1],
                                             up=LinkProfile(slice_bytes=slice_bytes)))
    _, writer = await asyncio.open_connection(*proxy.address)
    writer.write(payload)
    writer.write_eof()  # one write from the client: the proxy reads it as one chunk, or a few

    await asyncio.wait_for(sink.done.wait(), WAIT_S)
    stats = proxy.stats
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()

    assert sum(sink.reads) == stats.up.bytes_forwarded == len(payload)
    if slice_bytes is None:
        assert stats.up.writes == stats.up.chunks_forwarded
    else:  # every chunk's slices are whole slices but its last: at most one short slice a chunk
        assert stats.up.writes >= len(payload) / slice_bytes
        assert stats.up.writes <= len(payload) // slice_bytes + stats.up.chunks_forwarded


async def test_a_reset_after_some_bytes_cuts_a_sliced_link_at_exactly_that_byte() -> None:
    sink = Sink()
    server = await asyncio.start_server(sink.handle, "127.0.0.1", 0)
    profile = LinkProfile(slice_bytes=1, reset_after_bytes=1000)
    async with await WanProxy.create("127.0.0.1", server.sockets[0].getsockname()[1], up=profile) as proxy:
        _, writer = await asyncio.open_connection(*proxy.address)
        writer.write(bytes(3000))
        await asyncio.wait_for(sink.done.wait(), WAIT_S)
        stats = proxy.stats
        writer.close()
    server.close()
    await server.wait_closed()

    assert stats.up.bytes_forwarded == stats.up.writes == 1000  # the 1000th byte was the last written
    assert sum(sink.reads) <= 1000
    assert stats.connections_reset == 1
