"""gossamer TCP rows of the transport benchmark: the tensor codec's message as one REQUEST frame
(payload buffers sent without joining) to a ``TcpServer`` that decodes it and answers; the sender
times until that answer, the warm-up checks a CRC-32 of what arrived. ``reuse_buffer``: every
payload received into one preallocated buffer (a diagnostic row)."""

from __future__ import annotations

import asyncio
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy
from _common import BenchError, checksum, make_tensor, serve_worker
from _wan import maybe_proxy

from gossamer.transport.codec import decode_tensors, encode_tensors
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import ConnectionInfo, PayloadBufferHook, TcpServer, tcp_connect

REQUEST_TIMEOUT_S = 300.0


async def _receive(conn: Connection, params: dict[str, Any]) -> None:
    decode_s: list[float] = []

    async def handler(frame: Frame, info: ConnectionInfo) -> Frame:
        start = time.perf_counter()
        tensors = decode_tensors(frame.header["tensors"], frame.payload)
        decode_s.append(time.perf_counter() - start)
        crc = checksum(tensors["x"]) if frame.header.get("verify") else None
        return Frame(FrameType.RESPONSE, {"checksum": crc})

    server = await TcpServer.create(handler, payload_buffer=_reused_buffer(params))
    proxy = await maybe_proxy(server.address, params)
    await serve_worker(conn, _noop, ready={"address": (proxy or server).address}, closers=(proxy, server),
                       done=lambda: {"decode_s": decode_s})


def _reused_buffer(params: dict[str, Any]) -> PayloadBufferHook | None:
    """With ``params["reuse_buffer"]``: a hook handing out one buffer for every payload that fits.

    Safe here because the handler drops its views of the payload before the next frame arrives.
    """
    if not params.get("reuse_buffer"):
        return None
    buffer = numpy.zeros(params["size_bytes"], dtype=numpy.uint8)

    def hook(nbytes: int) -> Any:
        return buffer if nbytes <= buffer.nbytes else numpy.zeros(nbytes, dtype=numpy.uint8)

    return hook


async def _noop(index: int) -> dict[str, Any]:
    return {}


def receiver(conn: Connection, params: dict[str, Any]) -> None:
    """Run a TcpServer (behind the WAN proxy when ``params["wan"]``) until told to stop."""
    asyncio.run(_receive(conn, params))


async def _send(conn: Connection, params: dict[str, Any]) -> None:
    tensor = make_tensor(params["size_bytes"], params["seed"])
    client = await tcp_connect(*params["peers"][0]["address"])
    expected = checksum(tensor)

    async def on_go(index: int) -> dict[str, Any]:
        start = time.perf_counter()
        entries, buffers = encode_tensors({"x": tensor})
        frame = Frame(FrameType.REQUEST, {"tensors": entries, "verify": index == 0}, buffers)
        reply = await client.request(frame, timeout_s=REQUEST_TIMEOUT_S)
        seconds = time.perf_counter() - start
        if index == 0 and reply.header.get("checksum") != expected:
            raise BenchError(f"TCP receiver decoded a different tensor (crc {reply.header.get('checksum')})")
        return {"seconds": seconds}

    await serve_worker(conn, on_go, ready={}, closers=(client,))


def sender(conn: Connection, params: dict[str, Any]) -> None:
    """Connect to the receiver (or its proxy) and send the tensor once per repetition."""
    asyncio.run(_send(conn, params))
