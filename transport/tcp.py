"""TCP data plane: asyncio server and client exchanging frames (``transport.frames``); the public face
of ``tcp_stream``, ``tcp_server`` and ``tcp_client``. Foreign errors are translated here, once
(README.md, "TCP", has a usage example)."""

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
