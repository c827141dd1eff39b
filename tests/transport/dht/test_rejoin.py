"""A DHT node that lost every peer joins again (``rejoin``), against real hivemind nodes; a peer
that is really gone is one whose p2pd is frozen with SIGSTOP, so requests to it go unanswered."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

from hivemind.dht.node import DHTNode

from gossamer.crypto.identity import Identity
from gossamer.transport.dht.membership import DhtMembership
from tests.transport.dht.support import KEY

ALICE, CAROL = Identity.generate(), Identity.generate()


def node(member: DhtMembership) -> DHTNode:
    return member._node


def table(member: DhtMembership) -> set:
    return set(node(member).protocol.routing_table.peer_id_to_uid)


@contextmanager
def frozen(*members: DhtMembership) -> Iterator[None]:
    """Their p2pd stopped: requests to them go unanswered until the block ends."""
    pids = [member._p2p._child.pid for member in members]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def cut_off(lonely: DhtMembership, others: list[DhtMembership]) -> None:
    """What a stalled or starved host can come back to: its requests to every peer went unanswered
    and theirs to it did too. hivemind drops a peer from its routing table after one unanswered
    request, through ``update_routing_table(..., responded=False)``, called here as hivemind calls it
    (freezing p2pd gets there too, but which requests its queue delivers late, refilling a table,
    depends on timing)."""
    for other in others:
        await node(lonely).protocol.update_routing_table(None, other._p2p.peer_id, responded=False)
        await node(other).protocol.update_routing_table(None, lonely._p2p.peer_id, responded=False)
    assert table(lonely) == set()
    assert all(lonely._p2p.peer_id not in table(other) for other in others)


async def test_a_node_cut_off_from_every_peer_joins_again_and_reads_what_they_stored(
        swarm: list[DhtMembership]) -> None:
    first, lonely, third = swarm
    await cut_off(lonely, [first, third])

    expiration = first.now() + 60
    assert await third.store(KEY, b"stored while it was alone", signer=CAROL, expiration_time=expiration)
    seen = await lonely.get_all(KEY)

    assert seen == {CAROL.peer_id: (b"stored while it was alone", expiration)}
    assert lonely.rejoined == 1
    assert {first._p2p.peer_id, third._p2p.peer_id} <= table(lonely)


async def test_what_a_rejoined_node_stores_reaches_the_others(swarm: list[DhtMembership]) -> None:
    first, lonely, third = swarm
    await cut_off(lonely, [first, third])

    expiration = first.now() + 60
    assert await lonely.store(KEY, b"from the lonely one", signer=ALICE, expiration_time=expiration)

    assert await third.get_all(KEY) == {ALICE.peer_id: (b"from the lonely one", expiration)}
    assert lonely.rejoined == 1


async def test_the_first_node_rejoins_through_the_peers_it_knew(swarm: list[DhtMembership]) -> None:
    """The node that started the swarm has no initial peers: it rejoins through those it had met."""
    first, second, third = swarm
    await cut_off(first, [second, third])

    expiration = first.now() + 60
    assert await third.store(KEY, b"stored while the first was alone", signer=CAROL, expiration_time=expiration)

    assert await first.get_all(KEY) == {CAROL.peer_id: (b"stored while the first was alone", expiration)}
    assert first.rejoined == 1


async def test_a_node_whose_peers_are_gone_pays_one_bounded_attempt_per_retry_interval(
        swarm: list[DhtMembership]) -> None:
    first, lonely, third = swarm
    await cut_off(lonely, [first, third])
    with frozen(first, third):
        assert await lonely.get_all(KEY) == {}  # the attempt fails: nobody answers
        assert await lonely.get_all(KEY) == {}  # within retry_s: no second attempt
        assert lonely.rejoined == 0
        assert table(lonely) == set()
