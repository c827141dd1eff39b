"""Issue 30 item 4 at the peer layer, on a real volunteer relay on 127.0.0.1: it allocates only for
a run peer whose own signed record says its self-test found it private, and keeps the places new
identities cannot take for those the daemon trusts (the run owner, tenured or vouched-for peers)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gossamer.crypto.identity import Identity
from gossamer.peer.reach.relaying import volunteer
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.manifest import RunConfig, build_manifest
from gossamer.peer.run.records import PRIVATE, PUBLIC, RELAYED, UNKNOWN, seal_record
from gossamer.transport.relay import RelayClient, RelayConfig, RelayRefused
from gossamer.transport.tcp import TcpServer
from tests.peer.run.test_records import make_record

NOW = 1_800_000_000.0


@pytest.fixture
async def relay():
    owner = Identity.generate()
    admission = Admission(build_manifest(owner, RunConfig(name="relay"), now=NOW))
    trusted = Identity.generate()
    server = await volunteer(name=owner.peer_id, host="127.0.0.1", port=0, admission=admission, ttl_s=60.0,
                             now=lambda: NOW, config=RelayConfig(max_peers=3, max_untrusted_peers=2),
                             trusted=lambda peer_id: peer_id == trusted.peer_id)
    service = await TcpServer.create(lambda frame, info: None)
    yield server, service, trusted
    await service.aclose()
    await server.aclose()


async def allocate(server, service, who: Identity, reachability: str) -> RelayClient:
    record = seal_record(who, replace(make_record(who), timestamp=NOW, reachability=reachability))
    return await RelayClient.connect(server.address, relay_name=server.name, identity=who, auth=record,
                                     targets=[service.address], now=lambda: NOW)


@pytest.mark.parametrize("claim", [PUBLIC, UNKNOWN])
async def test_a_peer_whose_self_test_does_not_say_private_gets_no_allocation(relay, claim: str) -> None:
    server, service, _trusted = relay
    with pytest.raises(RelayRefused, match="self-test says private"):
        await allocate(server, service, Identity.generate(), claim)
    assert server.stats()["peers"] == 0


async def test_new_identities_fill_only_their_share_and_a_trusted_peer_still_gets_a_place(relay) -> None:
    server, service, trusted = relay
    clients = [await allocate(server, service, Identity.generate(), kind) for kind in (PRIVATE, RELAYED)]
    with pytest.raises(RelayRefused, match="nobody vouches for"):
        await allocate(server, service, Identity.generate(), PRIVATE)
    clients.append(await allocate(server, service, trusted, PRIVATE))
    assert server.stats()["peers"] == 3
    for client in clients:
        await client.aclose()
