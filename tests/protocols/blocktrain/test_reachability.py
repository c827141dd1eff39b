"""A private block server (its record says ``private``: nobody can dial it and no relay forwards to
it) is never a hop of a route, while a relayed one (its record carries its relay's addresses) is:
clients route around it and say so once, hosts refuse to forward to it, a block only it holds
fails with ``NoReachableHost`` naming it, and the coverage panel marks it. Real hosts behind TCP
servers on 127.0.0.1, announced by signed records in a real DHT node (the ``hosts`` fixture)."""

from __future__ import annotations

import logging

import pytest
import torch

from gossamer.crypto.identity import Identity
from gossamer.peer.route.client import HostEntry, NoReachableHost, RouteFailed, route_through
from gossamer.peer.route.pool import HopPool
from gossamer.peer.route.wire import FailedHop, Hop, parse_answer
from gossamer.peer.run.records import PRIVATE, PUBLIC, RELAYED, PeerRecord
from gossamer.protocols.blocktrain import panel
from gossamer.protocols.blocktrain.core import denoise_pass, initial_noise
from gossamer.protocols.blocktrain.host import METHOD
from tests.protocols.blocktrain.test_host import CONFIG, Hosts, client


async def test_a_route_never_goes_through_a_private_host_while_a_reachable_one_holds_its_blocks(
        hosts: Hosts, caplog: pytest.LogCaptureFixture) -> None:
    private = await hosts.add_blocks("private", (2, 1, 0), reachability=PRIVATE)  # the one-hop route, if dialable
    upper = await hosts.add_blocks("upper", (2,), reachability=PUBLIC)
    lower = await hosts.add_blocks("lower", (1, 0), reachability=RELAYED)
    remote = client(hosts)
    context = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))

    with caplog.at_level(logging.INFO, logger="gossamer.peer.route.client"):
        first = await remote.denoise_pass(context, generator=torch.Generator().manual_seed(7))
        again = await remote.denoise_pass(context, generator=torch.Generator().manual_seed(7))

    assert remote.route.last_route == (Hop(upper, (2,)), Hop(lower, (1, 0)))
    assert torch.equal(first, denoise_pass(hosts.stack, context, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(again, first) and remote.route.retries == 0
    assert hosts.host("private").served == 0
    assert remote.route.unreachable == {hosts.servers["private"][0].peer_id: private}
    said = [r.getMessage() for r in caplog.records if private in r.getMessage()]
    assert len(said) == 1 and "private" in said[0]  # once, not at every pass


async def test_a_host_refuses_to_forward_to_a_private_host(hosts: Hosts) -> None:
    upper = await hosts.add_blocks("upper", (2,), reachability=PUBLIC)
    private = await hosts.add_blocks("private", (1, 0), reachability=PRIVATE)
    z = initial_noise(CONFIG, (1, 8), generator=torch.Generator().manual_seed(0), device="cpu")
    pool = HopPool()
    try:
        answer = parse_answer(await pool.call(
            METHOD, run_id=hosts.manifest.run_id, request_id="r", budget_s=5.0,
            route=(Hop(upper, (2,)), Hop(private, (1, 0))),
            tensors={"z": z, "context": torch.zeros(1, 8, dtype=torch.long)}))
    finally:
        await pool.aclose()

    assert isinstance(answer, FailedHop) and answer.addr == private
    assert "private" in answer.reason and "no relay" in answer.reason
    assert hosts.host("private").served == 0


async def test_a_block_only_a_private_host_holds_fails_with_a_typed_error_naming_it(hosts: Hosts) -> None:
    await hosts.add_blocks("upper", (2,))
    private = await hosts.add_blocks("private", (1,), reachability=PRIVATE)
    await hosts.add_blocks("lower", (0,))
    remote = client(hosts, budget_s=1.0)  # the client reads the table again until the budget runs out

    with pytest.raises(NoReachableHost, match=rf"unit 1 is held only by private host\(s\) {private}") as failed:
        await remote.denoise_pass(torch.zeros(1, 8, dtype=torch.long), generator=torch.Generator().manual_seed(0))

    assert "no relay" in str(failed.value)
    assert hosts.host("private").served == 0 and remote.route.failures == {}


def test_route_through_skips_unreachable_hosts_and_names_them_when_nothing_else_is_left() -> None:
    table = [HostEntry("a", "A:1", (2, 1, 0), reachable=False), HostEntry("b", "B:1", (2,)),
             HostEntry("c", "C:1", (1, 0))]

    assert route_through([2, 1, 0], table) == (Hop("B:1", (2,)), Hop("C:1", (1, 0)))
    with pytest.raises(NoReachableHost, match=r"unit 1 is held only by private host\(s\) A:1"):
        route_through([2, 1, 0], table, exclude={"C:1"})
    with pytest.raises(RouteFailed, match="no live host serves unit 1") as no_host:  # nobody holds it at all
        route_through([2, 1, 0], table[1:], exclude={"C:1"})
    assert no_host.type is RouteFailed


def test_the_coverage_panel_marks_a_private_block_server() -> None:
    def server(name: str, reachability: str) -> PeerRecord:
        identity = Identity.generate()
        return PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name=name, http_addr="",
                          tcp_addr="10.0.0.1:1", roles=("block-server",), version="t", round=0, timestamp=0.0,
                          assignment={"blocks": [0], "block_versions": {"0": 3}}, reachability=reachability)

    shown = panel([server("open", PUBLIC), server("hidden", PRIVATE), server("via", RELAYED)])

    assert shown is not None and shown.rows == [[0, "-", "open v3, hidden v3 (private: not routed), via v3"]]
