"""A private peer's hold on a relay (``Relaying``) with two real relays on 127.0.0.1: it takes one,
announces its ports, moves to the other when the first goes, and lets go when no longer private."""

from __future__ import annotations

import asyncio

from gossamer.crypto.identity import Identity
from gossamer.peer.reach.relaying import Relaying
from gossamer.peer.run.records import PRIVATE, PUBLIC, UNKNOWN
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.relay import RelayServer
from gossamer.transport.tcp import TcpServer, tcp_connect
from tests.peer.run.test_records import make_record


async def pong(frame: Frame, info: object) -> Frame:
    return Frame(FrameType.RESPONSE, {"pong": True})


async def test_a_private_peer_moves_to_another_relay_when_its_relay_goes() -> None:
    me = Identity.generate()
    names = [Identity.generate() for _ in range(2)]
    relays = [await RelayServer.create(name=name.peer_id, authorize=lambda auth: me.peer_id) for name in names]
    server = await TcpServer.create(pong)
    volunteers = [make_record(name, relay=f"127.0.0.1:{r.address[1]}", reachability=kind)
                  for name, r, kind in zip(names, relays, (PUBLIC, UNKNOWN), strict=True)]
    candidates = [*volunteers, make_record(Identity.generate(), relay="127.0.0.1:9", reachability=PRIVATE)]
    changes: list[tuple[str, str] | None] = []
    verdict = {"kind": PRIVATE}
    changed = asyncio.Event()
    relaying = Relaying(identity=me, candidates=lambda: candidates, auth=lambda: b"me",
                        targets=lambda: [("127.0.0.1", server.address[1])] * 2,
                        on_change=lambda: (changes.append(relaying.addresses), changed.set()))

    async def until(kind_is_private: bool) -> None:
        while (verdict["kind"] == PRIVATE) != kind_is_private:
            changed.clear()
            await changed.wait()

    async def next_change() -> None:
        changed.clear()
        await changed.wait()

    holding = asyncio.create_task(relaying.hold(lambda: until(True), lambda: until(False), next_change))
    try:
        assert [r.peer_id for r in relaying.relays()] != [] and all(r.reachability != PRIVATE for r in relaying.relays())
        await next_change()
        first = relaying.relay_id
        assert relaying.addresses is not None
        host, port = relaying.addresses[1].split(":")
        connection = await tcp_connect(host, int(port))
        assert (await connection.request(Frame(FrameType.REQUEST, {}))).header == {"pong": True, "rid": 1}
        await connection.aclose()

        gone = next(r for r, v in zip(relays, volunteers, strict=True) if v.peer_id == first)
        await gone.aclose()
        while relaying.relay_id in ("", first):
            await next_change()
        assert relaying.addresses is not None and relaying.relay_id != first

        verdict["kind"] = PUBLIC
        changed.set()
        while relaying.addresses is not None:
            await next_change()
        assert changes[-1] is None
    finally:
        holding.cancel()
        await asyncio.gather(holding, return_exceptions=True)
        await relaying.release()
        for relay in relays:
            await relay.aclose()
        await server.aclose()
