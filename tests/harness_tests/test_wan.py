"""WanProxy: bytes intact and in order, latency / rate lower bounds, drops, resets, refusals, cleanup.
Slicing (``slice_bytes``) and the transports through it: ``test_wan_slicing.py``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random

import pytest

from gossamer.transport.errors import TransportError
from gossamer_harness.wan import LinkProfile, WanProxy, listen_socket

TIMEOUT_S = 20.0


class EchoServer:
    """Echoes every byte back and closes on EOF; records how each connection ended."""

    def __init__(self) -> None:
        self.connections = 0
        self.outcomes: asyncio.Queue[str] = asyncio.Queue(maxsize=64)
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        outcome = "eof"
        try:
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            outcome = "reset"
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):  # the reset was already recorded
                await writer.wait_closed()
            self.outcomes.put_nowait(outcome)


@pytest.fixture
async def echo():
    server = EchoServer()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    yield server
    listener.close()
    await listener.wait_closed()


async def read_all(reader: asyncio.StreamReader) -> tuple[bytes, str]:
    """Everything until EOF, and how the stream ended ("eof" or "reset")."""
    chunks = []
    try:
        while data := await asyncio.wait_for(reader.read(1 << 16), TIMEOUT_S):
            chunks.append(data)
    except ConnectionError:
        return b"".join(chunks), "reset"
    return b"".join(chunks), "eof"


async def send_then_eof(writer: asyncio.StreamWriter, payload: bytes) -> str:
    try:
        writer.write(payload)
        await asyncio.wait_for(writer.drain(), TIMEOUT_S)
        writer.write_eof()
    except ConnectionError:
        return "reset"
    return "eof"


async def exchange(address: tuple[str, int], payload: bytes) -> tuple[bytes, str]:
    """Send payload then half-close; read until the other side closes."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), TIMEOUT_S)
    sender = asyncio.create_task(send_then_eof(writer, payload))
    received, outcome = await read_all(reader)
    await sender
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return received, outcome


@pytest.mark.parametrize("profile", [
    LinkProfile(),
    LinkProfile(latency_s=0.005, jitter_s=0.01, seed=1),
    LinkProfile(rate_bytes_per_s=400e6, latency_s=0.002, jitter_s=0.002, seed=2),
], ids=["plain", "jitter", "rate+jitter"])
async def test_bulk_both_ways_intact_and_half_close_forwarded(echo: EchoServer, profile: LinkProfile) -> None:
    payload = random.Random(0).randbytes(8_000_000)
    async with await WanProxy.create("127.0.0.1", echo.port, up=profile) as proxy:
        received, outcome = await exchange(proxy.address, payload)
        stats = proxy.stats

    assert outcome == "eof"
    assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()
    assert await asyncio.wait_for(echo.outcomes.get(), TIMEOUT_S) == "eof"
    assert (stats.up.bytes_forwarded, stats.down.bytes_forwarded) == (len(payload), len(payload))
    assert (stats.connections_accepted, stats.connections_reset) == (1, 0)


async def test_a_connection_made_before_the_proxy_runs_waits_on_its_listener_and_is_served(echo: EchoServer) -> None:
    listener = listen_socket("127.0.0.1", 0)  # its port is known (and announced) before the target is
    payload = random.Random(1).randbytes(100_000)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*listener.getsockname()[:2]), TIMEOUT_S)
    writer.write(payload)  # connected (in the backlog) and sent before any proxy exists
    writer.write_eof()

    async with await WanProxy.create("127.0.0.1", echo.port, up=LinkProfile(), listener=listener) as proxy:
        received, outcome = await read_all(reader)
        assert proxy.address == listener.getsockname()[:2]
        assert proxy.stats.up.bytes_forwarded == len(payload)
    writer.close()

    assert (received, outcome) == (payload, "eof")
    assert listener.fileno() == -1  # the proxy owned it and closed it


async def test_a_listener_is_closed_when_the_proxy_cannot_start() -> None:
    listener = listen_socket("127.0.0.1", 0)
    with pytest.raises(TransportError):
        await WanProxy.create("no-such-host.invalid", 1, up=LinkProfile(), listener=listener)
    assert listener.fileno() == -1


async def test_round_trip_takes_at_least_twice_the_latency(echo: EchoServer) -> None:
    loop = asyncio.get_running_loop()
    async with await WanProxy.create("127.0.0.1", echo.port, up=LinkProfile(latency_s=0.1)) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.address)
        start = loop.time()
        writer.write(b"ping")
        answer = await asyncio.wait_for(reader.readexactly(4), TIMEOUT_S)
        elapsed_s = loop.time() - start
        writer.close()
        await writer.wait_closed()

    assert answer == b"ping"
    assert elapsed_s >= 0.2 - 1e-3


async def test_rate_cap_paces_a_transfer() -> None:
    loop = asyncio.get_running_loop()
    size_bytes, received = 1_000_000, loop.create_future()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.readexactly(size_bytes)
        received.set_result((loop.time(), data))
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    profile = LinkProfile(rate_bytes_per_s=4e6)
    payload = random.Random(1).randbytes(size_bytes)
    async with await WanProxy.create("127.0.0.1", server.sockets[0].getsockname()[1], up=profile) as proxy:
        _, writer = await asyncio.open_connection(*proxy.address)
        start = loop.time()
        writer.write(payload)
        end, data = await asyncio.wait_for(received, TIMEOUT_S)
        writer.close()
        await writer.wait_closed()
    server.close()
    await server.wait_closed()

    assert data == payload
    assert profile.burst_bytes == 64 * 1024
    assert end - start >= (size_bytes - profile.burst_bytes) / 4e6 - 1e-3


@pytest.mark.parametrize(("profile", "exact_bytes", "max_bytes"), [
    (LinkProfile(reset_after_bytes=100_000), 100_000, 100_000),
    (LinkProfile(reset_probability=1.0, reset_window_bytes=50_000, seed=3), None, 49_999),
], ids=["after-bytes", "probability"])
async def test_reset_reaches_both_endpoints(echo: EchoServer, profile: LinkProfile, exact_bytes: int | None,
                                            max_bytes: int) -> None:
    payload = random.Random(2).randbytes(1_000_000)
    async with await WanProxy.create("127.0.0.1", echo.port, up=profile, down=LinkProfile()) as proxy:
        received, client_outcome = await exchange(proxy.address, payload)
        server_outcome = await asyncio.wait_for(echo.outcomes.get(), TIMEOUT_S)
        stats = proxy.stats

    assert client_outcome in {"reset", "eof"} and server_outcome in {"reset", "eof"}
    assert len(received) <= max_bytes and payload.startswith(received)
    assert stats.connections_reset == 1
    assert stats.up.bytes_forwarded <= max_bytes
    if exact_bytes is not None:
        assert stats.up.bytes_forwarded == exact_bytes


async def test_refuse_probability_one_refuses_every_connection(echo: EchoServer) -> None:
    async with await WanProxy.create("127.0.0.1", echo.port, up=LinkProfile(refuse_probability=1.0)) as proxy:
        results = [await exchange(proxy.address, b"hello") for _ in range(3)]
        stats = proxy.stats

    assert all(data == b"" and outcome in {"reset", "eof"} for data, outcome in results)
    assert (stats.connections_refused, stats.connections_accepted, echo.connections) == (3, 0, 0)


async def test_connections_over_the_cap_are_refused(echo: EchoServer) -> None:
    async with await WanProxy.create("127.0.0.1", echo.port, up=LinkProfile(), max_connections=1) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.address)
        writer.write(b"ping")
        first_answer = await asyncio.wait_for(reader.readexactly(4), TIMEOUT_S)
        second = await exchange(proxy.address, b"hello")
        stats = proxy.stats
        writer.close()
        await writer.wait_closed()

    assert first_answer == b"ping"
    assert second[0] == b"" and second[1] in {"reset", "eof"}
    assert (stats.connections_accepted, stats.connections_refused) == (1, 1)


async def test_drops_delay_but_deliver_everything(echo: EchoServer) -> None:
    loop = asyncio.get_running_loop()
    payload = random.Random(3).randbytes(1_000_000)
    profile = LinkProfile(drop_probability=1.0, retransmit_delay_s=0.05, seed=4)
    async with await WanProxy.create("127.0.0.1", echo.port, up=profile) as proxy:
        start = loop.time()
        received, outcome = await exchange(proxy.address, payload)
        elapsed_s = loop.time() - start
        stats = proxy.stats

    assert outcome == "eof" and received == payload
    assert stats.up.chunks_dropped == stats.up.chunks_forwarded > 0
    assert elapsed_s >= 2 * 0.05 - 1e-3


@pytest.mark.parametrize(("fields", "name"), [
    ({"latency_s": -0.1}, "latency_s"),
    ({"latency_s": float("nan")}, "latency_s"),
    ({"jitter_s": -1}, "jitter_s"),
    ({"rate_bytes_per_s": 0}, "rate_bytes_per_s"),
    ({"rate_bytes_per_s": float("inf")}, "rate_bytes_per_s"),
    ({"drop_probability": 1.5}, "drop_probability"),
    ({"retransmit_delay_s": -0.2}, "retransmit_delay_s"),
    ({"reset_probability": -0.1}, "reset_probability"),
    ({"reset_window_bytes": 0}, "reset_window_bytes"),
    ({"reset_after_bytes": -1}, "reset_after_bytes"),
    ({"reset_after_bytes": 10, "reset_probability": 0.5}, "reset_after_bytes"),
    ({"refuse_probability": 2.0}, "refuse_probability"),
    ({"slice_bytes": 0}, "slice_bytes"),
    ({"slice_bytes": 1.5}, "slice_bytes"),
    ({"seed": "x"}, "seed"),
])
def test_link_profile_rejects_bad_fields(fields: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        LinkProfile(**fields)


def test_from_mbit_converts_units() -> None:
    profile = LinkProfile.from_mbit(100, 50, jitter_s=0.01)

    assert (profile.rate_bytes_per_s, profile.latency_s, profile.jitter_s) == (12.5e6, 0.05, 0.01)
    with pytest.raises(ValueError, match="mbit_per_s"):
        LinkProfile.from_mbit(0, 50)


@pytest.mark.parametrize(("options", "name"), [
    ({"max_connections": 0}, "max_connections"),
    ({"queue_chunks": 0}, "queue_chunks"),
    ({"queue_bytes": 0}, "queue_bytes"),
    ({"connect_timeout_s": 0}, "connect_timeout_s"),
    ({"up": None}, "up"),
])
async def test_create_rejects_bad_options(options: dict, name: str) -> None:
    kwargs = {"up": LinkProfile(), **options}
    with pytest.raises(ValueError, match=name):
        await WanProxy.create("127.0.0.1", 9, **kwargs)


async def test_create_translates_bind_errors() -> None:
    with pytest.raises(TransportError):
        await WanProxy.create("127.0.0.1", 9, up=LinkProfile(), listen_host="192.0.2.1")


async def test_aclose_with_live_connections_leaves_no_tasks_or_sockets(echo: EchoServer) -> None:
    tasks_before, fds_before = len(asyncio.all_tasks()), len(os.listdir("/proc/self/fd"))
    proxy = await WanProxy.create("127.0.0.1", echo.port, up=LinkProfile(latency_s=0.05))
    clients = [await asyncio.open_connection(*proxy.address) for _ in range(3)]
    for reader, writer in clients:
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), TIMEOUT_S) == b"ping"
    clients[0][1].write(b"x" * 1_000_000)  # bytes in flight while the proxy closes
    fds_live = len(os.listdir("/proc/self/fd"))

    await proxy.aclose()
    await proxy.aclose()
    server_outcomes = [await asyncio.wait_for(echo.outcomes.get(), TIMEOUT_S) for _ in clients]
    client_outcomes = [(await read_all(reader))[1] for reader, _ in clients]
    for _, writer in clients:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    assert fds_live >= fds_before + 1 + 4 * len(clients)
    assert set(server_outcomes) <= {"reset", "eof"} and set(client_outcomes) <= {"reset", "eof"}
    assert len(asyncio.all_tasks()) == tasks_before
    assert len(os.listdir("/proc/self/fd")) == fds_before


async def test_aclose_ends_a_relay_that_swallowed_a_cancellation(echo: EchoServer, monkeypatch) -> None:
    """Python 3.11's ``asyncio.wait_for`` can drop a cancellation that comes as its awaitable
    completes (the proxy's connect used it); the relay then went on into an hour-long blackhole
    and ``aclose`` waited for it for good (a chaos run hung there). Here a pipe swallows the first
    cancellation outright: aclose cancels what is left again until it is done."""
    from gossamer_harness import wan_link

    original = wan_link.Pipe.write_loop

    async def stubborn(self) -> None:
        try:
            await original(self)
        except asyncio.CancelledError:
            await asyncio.sleep(3600)  # as if the cancellation had never come

    monkeypatch.setattr(wan_link.Pipe, "write_loop", stubborn)
    tasks_before = len(asyncio.all_tasks())
    proxy = await WanProxy.create("127.0.0.1", echo.port, up=LinkProfile(latency_s=3600.0))
    _reader, writer = await asyncio.open_connection(*proxy.address)
    writer.write(b"into the blackhole")
    await asyncio.wait_for(writer.drain(), TIMEOUT_S)
    while echo.connections == 0:  # noqa: ASYNC110  (the proxy has connected to the target: passes of the loop)
        await asyncio.sleep(0)
    for _ in range(10):  # and started its pipes
        await asyncio.sleep(0)

    relaying = len(asyncio.all_tasks())
    await asyncio.wait_for(proxy.aclose(), TIMEOUT_S)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()

    assert relaying >= tasks_before + 5  # accept loop, the relay and its four pipes were running
    assert len(asyncio.all_tasks()) == tasks_before  # every one of them ended, the stubborn pipe too
