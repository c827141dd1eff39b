"""A shared access link (``AccessLink``): every connection of every proxy in front of one peer
charges the same bucket per direction, so together they get the link's rate, not the rate each."""

from __future__ import annotations

import asyncio
import random

import pytest

from gossamer_harness.wan import AccessLink, LinkProfile, WanProxy

TIMEOUT_S = 20.0
RATE = 4e6
SIZE = 1_000_000


class Sink:
    """Reads ``SIZE`` bytes per connection, answers b"ok", and notes when each payload was in."""

    def __init__(self) -> None:
        self.done: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=16)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readexactly(SIZE)
        self.done.put_nowait((asyncio.get_running_loop().time(), data))
        writer.write(b"ok")
        await writer.drain()
        writer.close()


async def send(address: tuple[str, int], payload: bytes) -> bytes:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), TIMEOUT_S)
    writer.write(payload)
    answer = await asyncio.wait_for(reader.readexactly(2), TIMEOUT_S)
    writer.close()
    await writer.wait_closed()
    return answer


@pytest.mark.parametrize("shared", [True, False], ids=["one access link", "a link per proxy"])
async def test_two_proxies_of_one_peer_share_its_access_link(shared: bool) -> None:
    loop = asyncio.get_running_loop()
    sink = Sink()
    server = await asyncio.start_server(sink.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    profile = LinkProfile(rate_bytes_per_s=RATE)
    access = AccessLink(RATE) if shared else None
    payloads = [random.Random(i).randbytes(SIZE) for i in range(2)]
    proxies = [await WanProxy.create("127.0.0.1", port, up=profile, access=access) for _ in range(2)]
    try:
        start = loop.time()
        answers = await asyncio.gather(*(send(p.address, data) for p, data in zip(proxies, payloads, strict=True)))
        arrivals = [await asyncio.wait_for(sink.done.get(), TIMEOUT_S) for _ in payloads]
    finally:
        for proxy in proxies:
            await proxy.aclose()
        server.close()
        await server.wait_closed()

    assert answers == [b"ok", b"ok"]
    assert sorted(data for _, data in arrivals) == sorted(payloads)
    last = max(t for t, _ in arrivals)
    if shared:  # both megabytes went through one bucket: at least their sum over the rate
        assert access is not None
        assert access.charged_bytes("inbound") == 2 * SIZE and access.charged_bytes("outbound") == 4
        assert last - start >= (2 * SIZE - access.burst_bytes) / RATE - 1e-3
    else:
        assert last - start >= (SIZE - profile.burst_bytes) / RATE - 1e-3


def test_access_link_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="rate_bytes_per_s"):
        AccessLink(0)
    with pytest.raises(ValueError, match="burst_bytes"):
        AccessLink(1e6, burst_bytes=0)
    with pytest.raises(ValueError, match="direction"):
        AccessLink(1e6).bucket("sideways", 0.0)
    assert AccessLink.from_mbit(100).rate_bytes_per_s == 12.5e6


async def test_create_rejects_an_access_link_of_the_wrong_type() -> None:
    with pytest.raises(ValueError, match="access"):
        await WanProxy.create("127.0.0.1", 1, up=LinkProfile(), access=12.5e6)  # type: ignore[arg-type]
