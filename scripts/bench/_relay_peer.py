"""One process of the relay rows (``_relay_rows``) inside a network namespace, a relay, a receiver
or a sender by its first argument (``USAGE``); it prints JSON lines and runs until stdin closes."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from gossamer.crypto.identity import Identity
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.relay import RelayClient, RelayConfig, RelayServer
from gossamer.transport.tcp import TcpServer, tcp_connect

SAMPLES = 16
BENCH_PEER = Identity.from_private_bytes(bytes(32))  # the one relayed peer: relay and receiver both know it


def say(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


async def until_stdin_closes() -> None:
    await asyncio.to_thread(sys.stdin.read)


async def answer(frame: Frame, info: object) -> Frame:
    view = frame.payload_views()[0] if frame.payload_views() else memoryview(b"")
    step = max(1, view.nbytes // SAMPLES)
    return Frame(FrameType.RESPONSE, {"n": view.nbytes, "sample": bytes(view[::step][:SAMPLES])})


async def relay(host: str, mode: str) -> None:
    server = await RelayServer.create(name="bench-relay", host=host, authorize=lambda auth: BENCH_PEER.peer_id,
                                      config=RelayConfig(zero_copy=mode == "splice"))
    say({"port": server.address[1]})
    await until_stdin_closes()
    await server.aclose()


async def receiver(host: str, relay_host: str = "", relay_port: str = "", mode: str = "splice") -> None:
    server = await TcpServer.create(answer, host=host, port=0)
    client = None
    if relay_host:
        client = await RelayClient.connect((relay_host, int(relay_port)), relay_name="bench-relay", identity=BENCH_PEER,
                                           auth=b"bench", targets=[(host, server.address[1])],
                                           zero_copy=mode == "splice")
    say({"port": client.ports[0] if client else server.address[1]})
    await until_stdin_closes()
    if client is not None:
        await client.aclose()
    await server.aclose()


async def sender(host: str, port: str, size: str) -> None:
    payload = bytearray(int(size))
    for i in range(0, len(payload), 4093):
        payload[i] = i % 251
    step = max(1, len(payload) // SAMPLES)
    expected = bytes(memoryview(payload)[::step][:SAMPLES])
    connection = await tcp_connect(host, int(port))
    say({"ready": True})
    while (await asyncio.to_thread(sys.stdin.readline)).strip() == "go":
        started = time.perf_counter()
        response = await connection.request(Frame(FrameType.REQUEST, {}, payload), timeout_s=600.0)
        seconds = time.perf_counter() - started
        say({"seconds": seconds, "ok": response.header.get("n") == len(payload)
             and response.header.get("sample") == expected})
    await connection.aclose()


USAGE = """\
_relay_peer.py relay HOST MODE                 a RelayServer; prints {"port": P}
_relay_peer.py receiver HOST [RELAY_HOST RELAY_PORT MODE]
                                               a TcpServer answering each request with its payload's length
                                               and a sample of its bytes; with a relay, also a RelayClient
                                               allocation; prints {"port": P} (the relay's port when relayed)
_relay_peer.py sender HOST PORT SIZE_BYTES     one connection; each "go" line on stdin sends one SIZE_BYTES
                                               request; prints {"seconds": s, "ok": bool}
MODE: splice (relayed bytes spliced in the kernel, transport.relay's default) or copy (through Python)."""

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("relay", "receiver", "sender"):
        sys.exit(USAGE)
    role, *rest = sys.argv[1:]
    asyncio.run({"relay": relay, "receiver": receiver, "sender": sender}[role](*rest))
