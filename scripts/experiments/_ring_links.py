"""Replaying one training step's real coefficient messages over emulated WAN links without compute
(``RingLinks``): the time the step's communication takes on that link when no compute stands in
its way."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gossamer.protocols.context.core import PlannedSend
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.tcp import ConnectionInfo, TcpConnection, TcpServer, tcp_connect
from gossamer_harness.wan import LinkProfile, WanProxy

LINKS = ("wan", "direct")
Delivery = tuple[int, str, int, int, int | None]
Frames = Mapping[tuple[int, int, tuple[str, int, int, int | None]], tuple[dict[str, Any], list[Any]]]


class RingLinks:
    """The servers, proxies and connections of a ring of ``chunks`` members: one ``TcpServer`` per
    member on loopback, a ``WanProxy`` in front of each (the link profile both ways), and from every
    member a connection to every other through the proxy ("wan") and straight ("direct")."""

    def __init__(self, servers: list[TcpServer], proxies: list[WanProxy], timeout_s: float) -> None:
        self.servers, self.proxies, self.timeout_s = servers, proxies, timeout_s
        self.connections: dict[str, dict[tuple[int, int], TcpConnection]] = {link: {} for link in LINKS}
        self._arrived: dict[Delivery, asyncio.Event] = {}

    @classmethod
    async def create(cls, chunks: int, profile: LinkProfile, *, timeout_s: float = 300.0) -> RingLinks:
        servers: list[TcpServer] = []
        proxies: list[WanProxy] = []
        links = cls(servers, proxies, timeout_s)
        try:
            for member in range(chunks):
                servers.append(await TcpServer.create(links._handler(member)))
                proxies.append(await WanProxy.create(*servers[-1].address, up=profile))
            for source in range(chunks):
                for target in range(chunks):
                    if source != target:
                        links.connections["wan"][source, target] = await tcp_connect(*proxies[target].address)
                        links.connections["direct"][source, target] = await tcp_connect(*servers[target].address)
        except BaseException:
            await links.aclose()
            raise
        return links

    def _handler(self, member: int):
        async def handle(frame: Frame, info: ConnectionInfo) -> None:
            header = frame.header
            self._event((member, header["kind"], header["layer"], header["owner"], header["user"])).set()

        return handle

    def _event(self, delivery: Delivery) -> asyncio.Event:
        return self._arrived.setdefault(delivery, asyncio.Event())

    async def replay(self, plan: Sequence[PlannedSend], frames: Frames, *, link: str) -> float:
        """Seconds from the first send until every planned message has arrived: the step's frames
        (the exact headers and payloads ``encode_message`` made) sent in the ring's dependency order
        (``message_plan``: a member sends, or passes on, a message once every message it depends on
        has been delivered to it) over ``link``."""
        self._arrived = {}
        start = time.perf_counter()

        async def send(planned: PlannedSend) -> None:
            for delivery in planned.after:
                await self._event(delivery).wait()
            header, payload = frames[planned.source, planned.target, planned.key]
            connection = self.connections[link][planned.source, planned.target]
            await connection.send(Frame(FrameType.ONEWAY, header, payload), timeout_s=self.timeout_s)
            await self._event((planned.target, *planned.key)).wait()

        async with asyncio.timeout(self.timeout_s):
            await asyncio.gather(*(send(planned) for planned in plan))
        return time.perf_counter() - start

    async def aclose(self) -> None:
        for connections in self.connections.values():
            for connection in connections.values():
                await connection.aclose()
        for closer in (*self.proxies, *self.servers):
            await closer.aclose()
