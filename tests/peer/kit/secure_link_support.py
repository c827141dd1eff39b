"""A SecureLinkServer behind a real TcpServer on 127.0.0.1 (running the link's gate, as the daemon
does) on a clock the test moves, with a client identity it authorizes; every frame the server
receives is kept in order; ``hello_frame`` does by hand what a client does to begin a handshake."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
import torch

from gossamer.crypto.handshake import Initiator
from gossamer.crypto.identity import Identity
from gossamer.peer.kit.secure_link import (
    COOKIE,
    HELLO,
    LinkMessage,
    RequestRefused,
    SecureLink,
    SecureLinkServer,
)
from gossamer.peer.metrics import Traffic
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import ConnectionInfo, TcpConnection, TcpServer

RUN = "tl@00112233aabbccdd"
METHOD = "test-link"


class Clock:
    """The server's clock: ``now`` seconds, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    client: Identity
    server_identity: Identity
    link_server: SecureLinkServer
    tcp: TcpServer
    traffic: Traffic
    clock: Clock
    wrap_reply: Callable[[Frame], Frame] = lambda frame: frame
    received: list[tuple[int, Frame]] = field(default_factory=list)
    """(connection id, frame) of every frame the server received, in order."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.tcp.address[1]}"

    async def connect(self, *, identity: Identity | None = None, server_key: bytes | None = None) -> SecureLink:
        return await SecureLink.connect(identity=identity or self.client, run_id=RUN,
                                        peer_id=self.server_identity.peer_id,
                                        public_key=server_key or self.server_identity.public_key,
                                        address=self.address, method=METHOD, timeout_s=5.0)


async def hello_frame(harness: Harness, conn: TcpConnection, identity: Identity | None = None,
                      *, claim: str | None = None) -> tuple[Initiator, Frame]:
    """A cookie asked for on ``conn``, then the handshake and its hello frame (not sent) made with
    it, by ``identity`` (the client by default) claiming to be ``claim`` (itself by default)."""
    identity = identity or harness.client
    cookie = await conn.request(Frame(FrameType.REQUEST, {"method": METHOD, "op": COOKIE}, b""), timeout_s=5.0)
    handshake = Initiator(identity, peer_public_key=harness.server_identity.public_key, run_id=RUN,
                          nonce=bytes(cookie.payload))
    return handshake, Frame(FrameType.REQUEST, {"method": METHOD, "op": HELLO, "peer": claim or identity.peer_id},
                            handshake.hello())


async def _handler(peer_id: str, message: LinkMessage) -> LinkMessage:
    if message.op == "refuse":
        raise RequestRefused("not today", code="nope")
    if message.op == "hang":
        await asyncio.Event().wait()
    doubled = {name: t * 2 for name, t in message.tensors.items()}
    return LinkMessage(message.op, message.step, {"from": peer_id, **message.fields}, doubled)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    client, server_identity = Identity.generate(), Identity.generate()
    allowed = {client.peer_id: client.public_key}

    def authorize(peer_id: str) -> bytes:
        if peer_id not in allowed:
            raise RequestRefused(f"peer {peer_id[:12]} may not talk to this server")
        return allowed[peer_id]

    traffic, clock = Traffic(), Clock()
    link_server = SecureLinkServer(identity=server_identity, run_id=RUN, method=METHOD, authorize=authorize,
                                   handler=_handler, traffic=traffic, clock=clock)
    box: list[Harness] = []

    async def dispatch(frame: Frame, info: ConnectionInfo) -> Frame:
        box[0].received.append((info.connection_id, Frame(frame.type, dict(frame.header), bytes(frame.payload))))
        reply = await link_server.serve(frame, info)
        return box[0].wrap_reply(reply)

    tcp = await TcpServer.create(dispatch, gate=lambda kind, header, size: link_server.admit(header, size))
    box.append(Harness(client, server_identity, link_server, tcp, traffic, clock))
    yield box[0]
    await tcp.aclose()


def message(step: int = 1, op: str = "echo") -> LinkMessage:
    return LinkMessage(op, step, {"note": "hi"}, {"x": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                                                 "r": torch.tensor([-(2**62), 5], dtype=torch.int64)})
