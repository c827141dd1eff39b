"""The reachability tests' network on 127.0.0.1: ``net`` gives an HTTP client and ``node()``, a
peer with real HTTP and TCP servers answering dial-backs (``Node``) in one open run."""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace

import pytest

from gossamer.crypto.identity import Identity
from gossamer.peer.reach.dialback import DialBack, DialBackLimits
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.manifest import RunConfig, build_manifest
from gossamer.peer.run.records import PUBLIC, PeerRecord
from gossamer.peer.serving import role_app, role_dispatcher
from gossamer.transport.http_client import HttpClient
from gossamer.transport.http_server import HttpServer
from gossamer.transport.tcp import TcpServer

NOW = 1_800_000_000.0


@dataclass
class Node:
    identity: Identity
    dialback: DialBack
    http: HttpServer
    tcp: TcpServer

    def record(self, **changes) -> PeerRecord:
        record = PeerRecord(peer_id=self.identity.peer_id, public_key=self.identity.public_key, name="", roles=(),
                            http_addr=f"127.0.0.1:{self.http.address[1]}", tcp_addr=f"127.0.0.1:{self.tcp.address[1]}",
                            version="t", round=0, timestamp=NOW, reachability=PUBLIC)
        return replace(record, **changes)


@pytest.fixture
async def net():
    owner = Identity.generate()
    admission = Admission(build_manifest(owner, RunConfig(name="reach"), now=NOW))
    client = await HttpClient.create()
    nodes: list[Node] = []

    async def node(limits: DialBackLimits = DialBackLimits(per_source_s=0.0)) -> Node:
        identity = Identity.generate()
        dialback = DialBack(peer_id=identity.peer_id, admission=admission, ttl_s=60.0, now=lambda: NOW,
                            http_client=client, limits=limits)
        http = await HttpServer.create(role_app([], None, extra=dialback.routes()))
        tcp = await TcpServer.create(role_dispatcher([], extra=dialback.tcp_methods()))
        nodes.append(Node(identity, dialback, http, tcp))
        return nodes[-1]

    yield client, node
    for n in nodes:
        await n.tcp.aclose()
        await n.http.aclose()
    await client.aclose()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


