"""TCP data plane: asyncio server and client exchanging frames (``transport.frames``).

This module is the public face; the parts live in three modules:

- ``tcp_stream``  ``TcpConfig``, ``TcpStats`` and ``FrameStream``: whole frames over one raw
                  non-blocking socket, payloads received straight into their final buffer.
- ``tcp_server``  ``TcpServer``: accepts connections, answers REQUEST frames with a handler,
                  feeds ONEWAY frames through a bounded queue, enforces the connection cap.
- ``tcp_client``  ``tcp_connect`` / ``TcpConnection``: concurrent requests matched by request id,
                  one-way sends.

Usage::

    async def handler(frame: Frame, info: ConnectionInfo) -> Frame | None:
        return Frame(FrameType.RESPONSE, {"ok": True}, frame.payload)

    server = await TcpServer.create(handler, config=TcpConfig())
    conn = await tcp_connect(*server.address, config=TcpConfig())
    reply = await conn.request(Frame(FrameType.REQUEST, {"op": "echo"}, b"bytes"))
    await conn.aclose()
    await server.aclose()

Foreign errors are translated here, once: refused or unreachable -> ``ConnectFailed``
(a ``ConnectionClosed``), EOF or reset (also mid-frame) -> ``ConnectionClosed``, every deadline
-> ``TransportTimeout``, bad bytes -> ``DecodeError``, an ERROR frame -> ``RemoteError`` /
``Overloaded``.
"""

from __future__ import annotations

from gossamer.transport.tcp_client import ConnectFailed, TcpConnection, error_from_frame, tcp_connect
from gossamer.transport.tcp_server import ConnectionInfo, Handler, HandlerError, TcpServer
from gossamer.transport.tcp_stream import (
    FrameGate,
    FrameStream,
    PayloadBufferHook,
    TcpConfig,
    TcpStats,
    error_frame,
)

__all__ = [
    "ConnectFailed",
    "ConnectionInfo",
    "FrameGate",
    "FrameStream",
    "Handler",
    "HandlerError",
    "PayloadBufferHook",
    "TcpConfig",
    "TcpConnection",
    "TcpServer",
    "TcpStats",
    "error_frame",
    "error_from_frame",
    "tcp_connect",
]
