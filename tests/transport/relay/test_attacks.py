"""Issue 30 item 4 on real sockets (127.0.0.1): thousands of connections to a relay's attach and
control ports, from one address or many, leave it few descriptors (none once the attacker left)
while an honest pair is served; silent first lines are cut at the deadline (an injected clock);
Sybils cannot fill it; a live relay process out of descriptors logs a few lines, no traceback."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import resource
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from gossamer.crypto.challenge import answer_challenge
from gossamer.crypto.identity import Identity
from gossamer.transport.frames import Frame, FrameType
from gossamer.transport.relay import RelayClient, RelayConfig, RelayRefused, RelayServer
from gossamer.transport.tcp import TcpServer, tcp_connect
from tests.transport.relay.support import ATTACKER, Clock, backlog, closed_by_peer, flood, held_at, until

ALICE = Identity.generate()
FLOOD = min(2000, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4)  # scaled from 19,500 to stay fast


def authorize(auth: bytes) -> str:
    """Stands in for the peer layer's check of a signed, admitted record: ``peer:<peer id>``."""
    if not auth.startswith(b"peer:"):
        raise RelayRefused("not a peer of this run")
    return auth[5:].decode()


async def echo(frame: Frame, info: object) -> Frame:
    return Frame(FrameType.RESPONSE, {"n": len(b"".join(bytes(v) for v in frame.payload_views()))})


async def served_through(port: int) -> bool:
    connection = await tcp_connect("127.0.0.1", port)
    try:
        return (await connection.request(Frame(FrameType.REQUEST, {}, b"x" * 100_000))).header["n"] == 100_000
    finally:
        await connection.aclose()


async def sybil_allocation(relay: RelayServer, source: str) -> bool:
    """A fresh identity's allocation, proven, from ``source``: whether the relay granted it (the
    connection stays open while the relay holds it)."""
    who = Identity.generate()
    reader, writer = await asyncio.open_connection(*relay.address, local_addr=(source, 0))
    challenge = json.loads(await reader.readline())
    proof = answer_challenge(who, nonce=base64.b64decode(challenge["nonce"]), audience=relay.name, now=time.time())
    writer.write(json.dumps({"op": "allocate", "services": 1, "auth": base64.b64encode(b"peer:" + who.peer_id.encode()).decode(),
                             "proof": base64.b64encode(proof).decode()}).encode() + b"\n")
    answer = json.loads(await reader.readline())
    SYBIL_WRITERS.append(writer)
    return answer.get("ok") is True


SYBIL_WRITERS: list[asyncio.StreamWriter] = []


@pytest.fixture
async def honest():
    """A relay with the default caps, and ALICE's echo server relayed by it from 127.0.0.1."""
    server = await TcpServer.create(echo)
    relay = await RelayServer.create(name="relay", authorize=authorize)
    client = await RelayClient.connect(relay.address, relay_name=relay.name, identity=ALICE,
                                       auth=b"peer:" + ALICE.peer_id.encode(), targets=[server.address])
    yield relay, client
    for writer in SYBIL_WRITERS:
        writer.close()
    SYBIL_WRITERS.clear()
    await client.aclose()
    await relay.aclose()
    await server.aclose()


@pytest.mark.parametrize("port_of", [lambda r: r.attach_port, lambda r: r.address[1]], ids=["attach", "control"])
async def test_a_connection_flood_from_one_address_holds_few_descriptors(honest, port_of) -> None:
    relay, client = honest
    port, socks = port_of(relay), []
    before = held_at(port)  # the honest peer's control connection, on the control port
    try:
        socks = await asyncio.to_thread(flood, port, FLOOD)
        await until(lambda: backlog(port) == 0)  # the relay has taken (and judged) every connection
        assert held_at(port) - before <= RelayConfig().max_unproven_per_address < FLOOD
        assert await served_through(client.ports[0])
    finally:
        for sock in socks:
            sock.close()
    await until(lambda: held_at(port) == before)  # the attacker left: nothing of it stays


async def test_a_flood_from_many_addresses_is_capped_in_total_and_honest_pairs_are_served(honest) -> None:
    relay, client = honest
    config, socks = RelayConfig(), []
    sources = [f"127.0.0.{i}" for i in range(2, 2 + 2 * config.max_unproven // config.max_unproven_per_address)]
    try:
        for source in sources:
            socks += await asyncio.to_thread(flood, relay.attach_port, 2 * config.max_unproven_per_address,
                                             source=source)
        await until(lambda: backlog(relay.attach_port) == 0)
        assert held_at(relay.attach_port) <= config.max_unproven < len(socks)
        assert await served_through(client.ports[0])  # its attach comes from a relayed host: not the crowd's pool
    finally:
        for sock in socks:
            sock.close()
    await until(lambda: held_at(relay.attach_port) == 0)


async def test_an_unpaired_attach_connection_is_closed_at_its_eof() -> None:
    """The relay's clock never moves here, so its line deadline cannot be what closes the pipe:
    only the EOF can (before the fix the half-open pipe stayed for good)."""
    relay = await RelayServer.create(name="relay", authorize=authorize, clock=Clock())
    sock = socket.create_connection(("127.0.0.1", relay.attach_port), source_address=(ATTACKER, 0))
    try:
        sock.sendall(b'{"op": "att')
        sock.shutdown(socket.SHUT_WR)
        await until(lambda: closed_by_peer(sock))
        assert closed_by_peer(sock)
        await until(lambda: held_at(relay.attach_port) == 0)  # and the relay let go of its end
    finally:
        sock.close()
        await relay.aclose()


async def test_silent_first_lines_are_cut_at_the_deadline() -> None:
    clock = Clock()
    relay = await RelayServer.create(name="relay", authorize=authorize, clock=clock,
                                     config=RelayConfig(line_timeout_s=5.0))
    socks = []
    try:
        for port in (relay.attach_port, relay.address[1]):
            socks += [socket.create_connection(("127.0.0.1", port), source_address=(ATTACKER, 0)) for _ in range(3)]
        await until(lambda: held_at(relay.attach_port) == 3 and held_at(relay.address[1]) == 3)
        clock.t += 4.9
        relay.expire()
        assert not any(closed_by_peer(sock) for sock in socks)
        clock.t += 0.2
        relay.expire()
        await until(lambda: all(closed_by_peer(sock) for sock in socks))
        await until(lambda: held_at(relay.attach_port) == 0 and held_at(relay.address[1]) == 0)
    finally:
        for sock in socks:
            sock.close()
        await relay.aclose()


async def test_sybils_from_one_host_take_a_few_allocations_and_an_honest_peer_still_gets_one(honest) -> None:
    relay, _client = honest
    config = RelayConfig()
    granted = [await sybil_allocation(relay, ATTACKER) for _ in range(config.max_peers)]
    assert sum(granted) == config.max_peers_per_address
    assert await sybil_allocation(relay, "127.0.0.1")  # another host (and trusted or not, there is room)


async def test_new_sybils_from_many_hosts_fill_only_the_untrusted_share() -> None:
    trusted = Identity.generate()
    server = await TcpServer.create(echo)
    relay = await RelayServer.create(name="relay", authorize=authorize, trusted=lambda peer_id: peer_id == trusted.peer_id)
    try:
        config = RelayConfig()
        granted = [await sybil_allocation(relay, f"127.0.0.{2 + i}") for i in range(config.max_peers)]
        assert sum(granted) == config.max_untrusted_peers < config.max_peers
        client = await RelayClient.connect(relay.address, relay_name=relay.name, identity=trusted,
                                           auth=b"peer:" + trusted.peer_id.encode(), targets=[server.address])
        assert await served_through(client.ports[0])
        await client.aclose()
    finally:
        for writer in SYBIL_WRITERS:
            writer.close()
        SYBIL_WRITERS.clear()
        await relay.aclose()
        await server.aclose()


def test_the_rate_cap_is_on_by_default() -> None:
    assert RelayConfig().rate_bytes_per_s > 0


async def test_out_of_descriptors_a_live_relay_logs_a_few_lines_no_traceback_and_serves_again(processes, tmp_path) -> None:
    """The relay in its own process at 256 descriptors, every free one taken: floods on both its
    ports make each accept fail (EMFILE) until the descriptors come back; then an honest pair."""
    proc = processes.start(["256"], program=[sys.executable, str(Path(__file__).with_name("relay_process.py"))],
                           log_path=tmp_path / "relay.log")
    ready = proc.wait_ready(timeout_s=60)
    os.kill(proc.proc.pid, signal.SIGUSR1)
    proc.wait_event(lambda e: e["event"] == "filled", timeout_s=60)
    socks = []
    try:
        for port in (ready["port"], ready["attach_port"]):
            socks += await asyncio.to_thread(flood, port, 100)  # within the listen backlog: connects complete
        proc.wait_log(lambda text: text.count("accept failed") + text.count("out of system resource") >= 2)
    finally:
        for sock in socks:
            sock.close()
    os.kill(proc.proc.pid, signal.SIGUSR2)
    proc.wait_event(lambda e: e["event"] == "released", timeout_s=60)
    server = await TcpServer.create(echo)
    try:
        client = await RelayClient.connect(("127.0.0.1", ready["port"]), relay_name="relay", identity=ALICE,
                                           auth=b"peer:" + ALICE.peer_id.encode(), targets=[server.address])
        assert await served_through(client.ports[0])
        await client.aclose()
    finally:
        await server.aclose()
    assert proc.stop() == 0
    log = proc.log()
    assert "Traceback" not in log and len(log.splitlines()) <= 2 * 20 + 5, log[-3000:]
