"""The reachability self-test on 127.0.0.1: real servers answer dial-backs; a peer whose announced
port takes no connection is private; the answerer dials nobody but the requester, and rarely."""

from __future__ import annotations

import pytest

from gossamer.crypto.signed import sign_object
from gossamer.peer.reach.dialback import DialBackLimits
from gossamer.peer.reach.selftest import SelfTest, private_line
from gossamer.peer.run.records import PRIVATE, PUBLIC, UNKNOWN, PeerRecord, seal_record
from gossamer.transport.errors import RemoteError
from gossamer.transport.http_client import HttpClient
from tests.peer.reach.conftest import Node, closed_port


def selftest(client: HttpClient, me: Node, record: PeerRecord, answerers: list[Node], changes: list) -> SelfTest:
    return SelfTest(http_client=client, probe=lambda: (record, seal_record(me.identity, record)),
                    candidates=lambda: [a.record() for a in answerers], on_change=lambda: changes.append(1))


async def test_a_peer_whose_servers_answer_is_public(net) -> None:
    client, node = net
    me, answerers, changes = await node(), [await node(), await node()], []
    verdict = await selftest(client, me, me.record(reachability=UNKNOWN), answerers, changes).check()
    assert (verdict.kind, verdict.answered, verdict.http, verdict.tcp) == (PUBLIC, 2, True, True)
    assert verdict.observed == ("127.0.0.1",) and changes == [1]


async def test_a_peer_whose_announced_port_takes_no_connection_is_private(net) -> None:
    client, node = net
    me, answerer, changes = await node(), await node(), []
    record = me.record(tcp_addr=f"127.0.0.1:{closed_port()}")
    verdict = await selftest(client, me, record, [answerer], changes).check()
    assert (verdict.kind, verdict.http, verdict.tcp) == (PRIVATE, True, False)
    line = private_line(verdict, http_addr=record.http_addr, tcp_addr=record.tcp_addr)
    assert record.tcp_addr in line and "--announce_host 127.0.0.1" in line and "\n" not in line


async def test_a_server_that_is_another_peer_does_not_count(net) -> None:
    client, node = net
    me, impostor, answerer = await node(), await node(), await node()
    record = me.record(http_addr=impostor.record().http_addr)  # someone answers there, but not me
    verdict = await selftest(client, me, record, [answerer], []).check()
    assert (verdict.kind, verdict.http, verdict.tcp) == (PRIVATE, False, True)


async def test_nobody_answering_leaves_the_verdict_unknown(net) -> None:
    client, node = net
    me, gone = await node(), await node()
    dead = gone.record(http_addr=f"127.0.0.1:{closed_port()}")
    test = SelfTest(http_client=client, probe=lambda: (me.record(), seal_record(me.identity, me.record())),
                    candidates=lambda: [dead], on_change=lambda: None)
    assert (await test.check()).kind == UNKNOWN


async def test_the_answerer_dials_only_the_address_the_request_comes_from(net) -> None:
    client, node = net
    me, answerer = await node(), await node()
    record = me.record(http_addr="192.0.2.1:80", tcp_addr="192.0.2.1:81")  # a third host
    url = f"http://127.0.0.1:{answerer.http.address[1]}/reach/dialback"
    answer = await client.put_bytes(url, seal_record(me.identity, record))
    assert answer["http"] is False and answer["tcp"] is False and "192.0.2.1" in answer["why"]
    assert answerer.dialback.answered == 0


async def test_dialbacks_need_a_record_signed_by_its_peer_and_are_rate_limited(net) -> None:
    client, node = net
    me, mallory = await node(), await node()
    answerer = await node(DialBackLimits(per_source_s=3600.0, per_minute=3))
    url = f"http://127.0.0.1:{answerer.http.address[1]}/reach/dialback"
    forged = sign_object(mallory.identity, me.record().body())
    with pytest.raises(RemoteError) as refused:
        await client.put_bytes(url, forged)
    assert refused.value.status == 403
    assert (await client.put_bytes(url, seal_record(me.identity, me.record())))["http"] is True
    with pytest.raises(RemoteError) as again:  # the same address: once per per_source_s
        await client.put_bytes(url, seal_record(me.identity, me.record()))
    assert again.value.status == 429
    with pytest.raises(RemoteError) as flooded:  # another identity from the same address: its budget all the same
        await client.put_bytes(url, seal_record(mallory.identity, mallory.record()))
    assert flooded.value.status == 429
    assert answerer.dialback.answered == 1
