"""TcpServer against peers that never authenticate (issue 10): hundreds of sockets stalled
mid-frame from one address leave honest peers served, a frame dripped below the minimum rate is
cut at its whole-frame deadline and a new connection's first head at the first-frame deadline,
the gate refuses a header before its payload is allocated, and
the receive budget refuses what it cannot hold and gives every byte back. Real sockets on
loopback; attackers connect from 127.0.0.1, honest peers from 127.0.0.2."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gossamer.transport.frames import Frame, FrameType, encode_frame
from gossamer.transport.tcp import HandlerError, TcpConfig
from tests.transport.support import WAIT_S, TcpNet, dripping, echo, frame_head

HONEST = "127.0.0.2"


def request_bytes(header: dict[str, Any], payload: bytes = b"") -> bytes:
    return b"".join(bytes(part) for part in encode_frame(Frame(FrameType.REQUEST, header, payload)))


async def honest_echo(net: TcpNet, server, text: str) -> Frame:
    honest = await net.raw(server, source=HONEST)
    await honest.send(request_bytes({"x": text, "rid": 1}))
    return await honest.read_frame()


async def test_hundreds_of_sockets_stalled_mid_frame_from_one_address_leave_honest_peers_served(
        net: TcpNet) -> None:
    config = TcpConfig(max_connections=256, max_connections_per_address=32, first_frame_timeout_s=3 * WAIT_S,
                       read_timeout_s=3 * WAIT_S, idle_timeout_s=3 * WAIT_S)
    server = await net.server(echo, config)
    attackers = [await net.raw(server) for _ in range(260)]
    for raw in attackers:
        await raw.send(b"GSM")  # three bytes of a prefix, then nothing: each holds its slot mid-frame

    answer = await honest_echo(net, server, "still served")
    refusals = [await raw.read_frame() for raw in attackers[32:]]

    assert answer.type is FrameType.RESPONSE and answer.header["echo"] == "still served"
    assert all(frame.header["code"] == "overloaded" and "from your address" in frame.header["message"]
               for frame in refusals)
    assert server.refused_connections == 260 - 32 and server.stats.connections_open == 32 + 1


async def test_a_frame_dripped_below_the_minimum_rate_is_cut_at_its_whole_frame_deadline(
        net: TcpNet, server_log) -> None:
    config = TcpConfig(read_timeout_s=1.0, min_rate_bytes_per_s=1000, first_frame_timeout_s=WAIT_S)
    server = await net.server(echo, config)
    cut = server_log("not whole within its deadline")
    dripper = await net.raw(server)
    await dripper.send(frame_head({"x": "slow"}, 500))

    async with dripping(dripper, bytes(500)):  # 25 s at 20 bytes/s; its deadline is 1.5 s
        await asyncio.wait_for(cut.seen.wait(), 3 * WAIT_S)
        leftover = await dripper.read_until_eof()
    answer = await honest_echo(net, server, "after")

    assert leftover == b"" and answer.header["echo"] == "after"
    assert server.budget.held_bytes == 0


async def test_a_new_connection_dripping_its_first_frames_head_is_cut_at_the_first_frame_deadline(
        net: TcpNet, server_log) -> None:
    config = TcpConfig(first_frame_timeout_s=0.5, read_timeout_s=3 * WAIT_S)
    server = await net.server(echo, config)
    cut = server_log("not whole within its deadline")
    dripper = await net.raw(server)

    async with dripping(dripper, frame_head({"x": "slow", "padding": "p" * 200}, 0)):  # an 11 s head
        await asyncio.wait_for(cut.seen.wait(), 2 * WAIT_S)
        leftover = await dripper.read_until_eof()
    answer = await honest_echo(net, server, "after")

    assert leftover == b"" and answer.header["echo"] == "after"


async def test_the_gate_refuses_a_header_before_its_payload_is_allocated(net: TcpNet) -> None:
    def gate(frame_type: FrameType, header: dict[str, Any], payload_len: int) -> None:
        if payload_len > 1024:
            raise HandlerError(f"{header.get('method')}: payload of {payload_len} bytes exceeds this method's cap")

    server = await net.server(echo, gate=gate)
    attacker = await net.raw(server)

    await attacker.send(frame_head({"method": "anything", "rid": 1}, 1 << 30) + bytes(4096))
    refused = await attacker.read_frame()
    leftover = await attacker.read_until_eof()
    answer = await honest_echo(net, server, "small")

    assert refused.type is FrameType.ERROR and refused.header["code"] == "refused"
    assert "payload of 1073741824 bytes exceeds" in refused.header["message"] and leftover == b""
    assert answer.header["echo"] == "small"
    assert server.budget.peak_bytes == 0


async def test_the_receive_budget_refuses_what_it_cannot_hold_and_gives_every_byte_back(net: TcpNet) -> None:
    config = TcpConfig(max_inflight_payload_bytes=1 << 20, read_timeout_s=WAIT_S, first_frame_timeout_s=WAIT_S)
    headers_in = asyncio.Event()

    def gate(frame_type: FrameType, header: dict[str, Any], payload_len: int) -> None:
        headers_in.set()  # the payload's bytes are held right after this, before the server awaits

    server = await net.server(echo, config, gate=gate)
    size = 600 << 10
    first, second = await net.raw(server), await net.raw(server, source=HONEST)

    await first.send(frame_head({"x": "first", "rid": 1}, size) + bytes(1000))
    await asyncio.wait_for(headers_in.wait(), WAIT_S)
    held_while_receiving = server.budget.held_bytes
    await second.send(frame_head({"x": "second", "rid": 1}, size) + bytes(size))
    refused = await second.read_frame()
    await first.send(bytes(size - 1000))
    completed = await first.read_frame()
    held_after = server.budget.held_bytes
    later = await honest_echo(net, server, "later")

    assert (held_while_receiving, held_after) == (size, 0)
    assert refused.header["code"] == "overloaded" and "receive budget full" in refused.header["message"]
    assert completed.header["echo"] == "first" and len(completed.payload) == size
    assert later.header["echo"] == "later"
    assert server.budget.peak_bytes == size


@pytest.mark.parametrize(("field", "value"), [("first_frame_timeout_s", 0.0), ("min_rate_bytes_per_s", 0),
                                              ("max_connections_per_address", -1),
                                              ("max_inflight_payload_bytes", 1.5)])
def test_config_refuses_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        TcpConfig(**{field: value})
