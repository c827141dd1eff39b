"""SignedMessenger over a real HttpServer on loopback, its senders found through real signed
records in a PeerView (issues 10 and 21): a stranger, a peer without the route's role, an
envelope for another round or another path are all refused (403) before a body byte is read, so
a 1 GiB Content-Length costs nothing; a message moved to another endpoint in transit is refused
and the genuine one still accepted; a forged body under a genuine envelope never burns its
nonce; an admitted sender's body over the route's size is 413; every honest message arrives."""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import AsyncIterator

import pytest
import torch
from aiohttp import web

from gossamer.crypto.envelope import payload_digest, seal
from gossamer.crypto.identity import Identity
from gossamer.peer.kit.messaging import ENVELOPE_HEADER, SignedMessenger, body_cap, request_target
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.manifest import build_manifest, run_config_from_dict
from gossamer.peer.run.records import PeerRecord, seal_record
from gossamer.peer.run.view import PeerView
from gossamer.transport.errors import RemoteError
from gossamer.transport.http import HttpConfig
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer, path_int
from gossamer.transport.safetensors_stream import encode_safetensors
from tests.transport.support import WAIT_S, LeakCheck, RawClient

EXPECTED = {"w": torch.zeros(64, 32), "b": torch.zeros(32)}
ROLE = "sender"


class Box:
    """A peer receiving signed messages at ``PUT /box/{kind}/{round}`` from live peers with ``ROLE``."""

    def __init__(self, identity: Identity, run_id: str, view: PeerView, client: HttpClient) -> None:
        self.messenger = SignedMessenger(identity=identity, run_id=run_id, client=client, view=view, now=time.time,
                                         limits=HttpConfig().limits, max_body_bytes=HttpConfig().max_body_bytes)
        self.received: list[tuple[str, int, str, dict[str, torch.Tensor]]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_put("/box/{kind}/{round}", self.receive)
        return app

    async def receive(self, request: web.Request) -> web.Response:
        kind, round = request.match_info["kind"], path_int(request, "round")
        got = await self.messenger.receive(request, sender_role=ROLE, round=round, max_body_bytes=body_cap(EXPECTED))
        self.received.append((kind, round, got.envelope.sender, got.tensors))
        return web.json_response({"accepted": True})


class Net:
    def __init__(self) -> None:
        self.owner = Identity.generate()
        doc = {"run": {"name": "box", "protocol": "none", "heartbeat_s": 30.0}}
        self.manifest = build_manifest(self.owner, run_config_from_dict(doc), now=time.time())
        self.view = PeerView(Admission(self.manifest), ttl_s=self.manifest.ttl_s)
        self.records: dict[str, tuple[bytes, float]] = {}
        self.closers: list = []

    def publish(self, identity: Identity, roles: tuple[str, ...]) -> None:
        now = time.time()
        record = PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name="", http_addr="",
                            tcp_addr="", roles=roles, version="test", round=0, timestamp=now)
        self.records[identity.peer_id] = (seal_record(identity, record), now + 600.0)
        self.view.update(dict(self.records), now=now)

    async def start(self) -> None:
        self.client = await HttpClient.create(config=HttpConfig())
        self.closers.append(self.client.aclose)
        self.me = Identity.generate()
        self.box = Box(self.me, self.manifest.run_id, self.view, self.client)
        self.server = await HttpServer.create(self.box.app(), config=HttpConfig(idle_timeout_s=3 * WAIT_S))
        self.closers.append(self.server.aclose)
        self.sender = Identity.generate()
        self.publish(self.sender, (ROLE,))

    def messenger_of(self, identity: Identity) -> SignedMessenger:
        return SignedMessenger(identity=identity, run_id=self.manifest.run_id, client=self.client, view=self.view,
                               now=time.time, limits=HttpConfig().limits, max_body_bytes=HttpConfig().max_body_bytes)

    def url(self, kind: str, round: int) -> str:
        return self.server.url(f"/box/{kind}/{round}")


@pytest.fixture
async def net() -> AsyncIterator[Net]:
    check = LeakCheck()
    network = Net()
    await network.start()
    yield network
    for close in reversed(network.closers):
        await close()
    check.verify()


def tensors(value: float = 1.0) -> dict[str, torch.Tensor]:
    return {name: torch.full_like(t, value) for name, t in EXPECTED.items()}


def envelope_header(sender: Identity, recipient: Identity, run_id: str, *, url: str, round: int,
                    body_digest: bytes) -> str:
    blob = seal(sender, recipient=recipient.peer_id, run_id=run_id, round=round, method="PUT",
                target=request_target(url), payload_digest=body_digest, now=time.time(),
                nonce=secrets.token_bytes(16))
    return base64.b64encode(blob).decode()


async def test_honest_messages_arrive(net: Net) -> None:
    sender = net.messenger_of(net.sender)

    reply = await sender.request(net.url("params", 3), recipient=net.me.peer_id, round=3, tensors=tensors(2.0))

    assert reply.answer == {"accepted": True}
    [(kind, round, who, got)] = net.box.received
    assert (kind, round, who) == ("params", 3, net.sender.peer_id) and torch.equal(got["w"], EXPECTED["w"] + 2.0)


@pytest.mark.parametrize("who", ["no envelope", "garbage", "stranger", "wrong role", "other round", "other path",
                                 "other recipient"])
async def test_anyone_unadmitted_is_refused_before_a_body_byte_is_read(net: Net, who: str) -> None:
    sender, round, signed_url = net.sender, 3, net.url("params", 3)
    if who == "stranger":
        sender = Identity.generate()
    elif who == "wrong role":
        sender = Identity.generate()
        net.publish(sender, ("learner",))
    elif who == "other round":
        round = 4
    elif who == "other path":
        signed_url = net.url("pgrad", 3)
    recipient = Identity.generate() if who == "other recipient" else net.me
    header = {"no envelope": "", "garbage": "bm90IGFuIGVudmVsb3Bl"}.get(who)
    if header is None:
        header = envelope_header(sender, recipient, net.manifest.run_id, url=signed_url, round=round,
                                 body_digest=bytes(32))
    raw = await RawClient.connect(net.server.address)
    try:  # headers announcing 1 GiB, then not one body byte: the answer must not wait for any
        await raw.send(f"PUT /box/params/3 HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 30}\r\n"
                       f"{ENVELOPE_HEADER}: {header}\r\n\r\n".encode())
        head = await raw.read_response_head()
        peak = net.server.budget.peak_bytes
        honest = await net.messenger_of(net.sender).request(net.url("params", 3), recipient=net.me.peer_id, round=3,
                                                            tensors=tensors())
    finally:
        await raw.aclose()

    assert head.startswith(b"HTTP/1.1 403") and b"envelope refused" in head
    assert peak == 0 and honest.answer == {"accepted": True}
    assert [(kind, who) for kind, _, who, _ in net.box.received] == [("params", net.sender.peer_id)]


async def test_a_message_moved_to_another_path_is_refused_and_the_genuine_one_still_accepted(net: Net) -> None:
    size, chunks = encode_safetensors(tensors(5.0))
    genuine = net.url("params", 3)
    header = {ENVELOPE_HEADER: envelope_header(net.sender, net.me, net.manifest.run_id, url=genuine, round=3,
                                               body_digest=payload_digest(*chunks))}

    with pytest.raises(RemoteError) as moved:  # rewritten in transit: params -> pgrad
        await net.client.put_body(net.url("pgrad", 3), size, chunks, extra_headers=header)
    accepted = await net.client.put_body(genuine, size, chunks, extra_headers=header)
    with pytest.raises(RemoteError) as replayed:
        await net.client.put_body(genuine, size, chunks, extra_headers=header)

    assert moved.value.status == 403 and replayed.value.status == 403
    assert accepted == {"accepted": True}
    assert [(kind, round) for kind, round, _, _ in net.box.received] == [("params", 3)]


async def test_a_message_captured_before_a_restart_is_refused_after_it(net: Net) -> None:
    """The receiver's nonce memory dies with its process; its new messenger refuses every envelope
    stamped before it started, so the captured message is not taken twice."""
    size, chunks = encode_safetensors(tensors(5.0))
    url = net.url("params", 3)
    header = {ENVELOPE_HEADER: envelope_header(net.sender, net.me, net.manifest.run_id, url=url, round=3,
                                               body_digest=payload_digest(*chunks))}
    assert await net.client.put_body(url, size, chunks, extra_headers=header) == {"accepted": True}

    net.box.messenger = net.messenger_of(net.me)  # the restart: a fresh messenger, started after the stamp
    with pytest.raises(RemoteError) as replayed:
        await net.client.put_body(url, size, chunks, extra_headers=header)
    fresh = await net.messenger_of(net.sender).request(url, recipient=net.me.peer_id, round=3, tensors=tensors(1.0))

    assert replayed.value.status == 403 and fresh.answer == {"accepted": True}
    assert len(net.box.received) == 2


async def test_a_forged_body_under_a_genuine_envelope_does_not_burn_its_nonce(net: Net) -> None:
    size, chunks = encode_safetensors(tensors(5.0))
    forged_size, forged_chunks = encode_safetensors(tensors(-100.0))
    url = net.url("params", 3)
    header = {ENVELOPE_HEADER: envelope_header(net.sender, net.me, net.manifest.run_id, url=url, round=3,
                                               body_digest=payload_digest(*chunks))}

    with pytest.raises(RemoteError) as forged:
        await net.client.put_body(url, forged_size, forged_chunks, extra_headers=header)
    accepted = await net.client.put_body(url, size, chunks, extra_headers=header)

    assert forged.value.status == 403 and accepted == {"accepted": True}
    assert torch.equal(net.box.received[0][3]["b"], EXPECTED["b"] + 5.0)


async def test_an_admitted_senders_body_over_the_routes_size_is_413(net: Net) -> None:
    sender = net.messenger_of(net.sender)
    oversized = {**tensors(), "extra": torch.zeros(1 << 20)}

    with pytest.raises(RemoteError) as refused:
        await sender.request(net.url("params", 3), recipient=net.me.peer_id, round=3, tensors=oversized)
    reply = await sender.request(net.url("params", 4), recipient=net.me.peer_id, round=4, tensors=tensors())

    assert refused.value.status == 413 and reply.answer == {"accepted": True}
    assert net.server.budget.peak_bytes <= body_cap(EXPECTED)
