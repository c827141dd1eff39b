"""Issue 30 item 5 on 127.0.0.1: Sybils answering dial-backs "not reached" cannot vote an honest,
reachable peer private (the self-test asks tenured or vouched-for answerers, one reached outvotes
any not-reached, and private needs a quorum); the dial-back budget is spent only on verified
requests, and one source address spends only its own share of it, whatever identities it shows."""

from __future__ import annotations

from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import sign_object
from gossamer.peer.reach.dialback import DialBackLimits
from gossamer.peer.reach.selftest import SelfTest
from gossamer.peer.run.records import PRIVATE, PUBLIC, UNKNOWN, PeerRecord, seal_record
from gossamer.transport.errors import RemoteError
from gossamer.transport.http_server import HttpServer
from tests.peer.reach.conftest import NOW, closed_port

SYBILS = 6


@pytest.fixture
async def sybils():
    """``SYBILS`` answerers running modified code: whatever they are asked, "not reached"."""
    servers = []

    async def lie(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"observed": "127.0.0.1", "http": False, "tcp": False, "why": ""})

    records = []
    for _ in range(SYBILS):
        app = web.Application()
        app.add_routes([web.put("/reach/dialback", lie)])
        servers.append(await HttpServer.create(app))
        who = Identity.generate()
        records.append(PeerRecord(peer_id=who.peer_id, public_key=who.public_key, name="", roles=("learner",),
                                  http_addr=f"127.0.0.1:{servers[-1].address[1]}", tcp_addr="127.0.0.1:9",
                                  version="t", round=0, timestamp=NOW, reachability=PUBLIC))
    yield records
    for server in servers:
        await server.aclose()


def selftest_of(client, me, candidates, trusted=lambda peer_id: False) -> SelfTest:
    record = me.record(reachability=UNKNOWN)
    return SelfTest(http_client=client, probe=lambda: (record, seal_record(me.identity, record)),
                    candidates=lambda: candidates, on_change=lambda: None, trusted=trusted)


async def test_sybil_answerers_cannot_vote_a_reachable_peer_private(net, sybils) -> None:
    client, node = net
    me, owner = await node(), await node()  # the owner's (or a tenured peer's) answer is the one believed
    test = selftest_of(client, me, [*sybils, owner.record()], trusted=lambda peer_id: peer_id == owner.identity.peer_id)
    kinds = [(await test.check()).kind for _ in range(8)]
    assert kinds == [PUBLIC] * 8


async def test_with_nobody_vetted_one_reached_outvotes_every_sybil(net, sybils) -> None:
    client, node = net
    me, honest = await node(), await node()
    test = selftest_of(client, me, [*sybils, honest.record()])
    kinds = [(await test.check()).kind for _ in range(8)]
    assert kinds == [PUBLIC] * 8


async def test_one_not_reached_is_no_quorum(net, sybils) -> None:
    client, node = net
    me, gone = await node(), await node()
    dead = [replace(gone.record(), peer_id=f"{gone.identity.peer_id[:-1]}{i}", http_addr=f"127.0.0.1:{closed_port()}")
            for i in range(2)]  # two answerers that never answer, one that says "not reached"
    assert (await selftest_of(client, me, [sybils[0], *dead]).check()).kind == UNKNOWN


async def test_a_quorum_of_vetted_answerers_that_cannot_reach_makes_a_peer_private(net, sybils) -> None:
    client, node = net
    me, a, b = await node(), await node(), await node()
    vetted = {a.identity.peer_id, b.identity.peer_id}
    record = me.record(reachability=UNKNOWN, tcp_addr=f"127.0.0.1:{closed_port()}")
    test = SelfTest(http_client=client, probe=lambda: (record, seal_record(me.identity, record)),
                    candidates=lambda: [*sybils, a.record(), b.record()], on_change=lambda: None,
                    trusted=lambda peer_id: peer_id in vetted)
    verdict = await test.check()
    assert (verdict.kind, verdict.answered, verdict.vetted) == (PRIVATE, 2, True)


async def put_from(source: str, url: str, body: bytes) -> int:
    """A dial-back request sent from the loopback address ``source``; its HTTP status."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0), force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session, session.put(url, data=body) as answer:
        await answer.read()
        return answer.status


async def test_unverified_requests_spend_no_dialback_budget(net) -> None:
    client, node = net
    me, mallory = await node(), await node()
    answerer = await node(DialBackLimits(per_source_s=0.0, per_minute=3))
    url = f"http://127.0.0.1:{answerer.http.address[1]}/reach/dialback"
    statuses = [await put_from("127.0.0.2", url, b"not a signed record" * i) for i in range(1, 21)]
    statuses += [await put_from("127.0.0.3", url, sign_object(mallory.identity, me.record().body())) for _ in range(20)]
    assert set(statuses) == {403}  # unsigned, or signed by another key than the record's
    answer = await client.put_bytes(url, seal_record(me.identity, me.record()))
    assert answer["http"] is True and answer["tcp"] is True and answerer.dialback.answered == 1


async def test_one_source_spends_only_its_own_share_whatever_identities_it_shows(net) -> None:
    client, node = net
    me = await node()
    answerer = await node(DialBackLimits(per_source_s=3600.0, per_minute=3))
    url = f"http://127.0.0.1:{answerer.http.address[1]}/reach/dialback"
    sybils = [Identity.generate() for _ in range(10)]
    statuses = []
    for who in sybils:
        record = replace(me.record(), peer_id=who.peer_id, public_key=who.public_key,
                         http_addr="127.0.0.2:9", tcp_addr="127.0.0.2:9")
        statuses.append(await put_from("127.0.0.2", url, seal_record(who, record)))
    assert statuses == [200] + [429] * 9
    answer = await client.put_bytes(url, seal_record(me.identity, me.record()))
    assert answer["http"] is True and answerer.dialback.answered == 2
    with pytest.raises(RemoteError) as again:
        await client.put_bytes(url, seal_record(me.identity, me.record()))
    assert again.value.status == 429
