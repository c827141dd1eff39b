"""DhtMembership against real hivemind DHT nodes (and their p2pd children) on 127.0.0.1."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator

import pytest
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P

from gossamer.transport.dht import BootstrapFailed, DhtConfig, DhtMembership, DhtStartFailed
from gossamer.transport.errors import TransportError

KEY = "run/demo@ab12cd34/peers"
MADE_UP_PEER_ID = "QmXfptdHU6hqG95JswxYVUH4bphcK8y18mhFcgUQFe6fCN"
FAST = {"bootstrap_timeout_s": 3.0, "request_timeout_s": 3.0}


def p2pd_children() -> set[int]:
    """Pids of processes whose parent is this test process and whose command is p2pd."""
    pids = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                stat = stat_file.read()
        except (FileNotFoundError, ProcessLookupError):  # the process just exited
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        if comm == "p2pd" and parent == os.getpid():
            pids.add(int(entry))
    return pids


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def join(first: DhtMembership, **overrides: object) -> DhtMembership:
    return await DhtMembership.create(DhtConfig(initial_peers=tuple(first.visible_maddrs()), **FAST, **overrides))


@pytest.fixture
async def swarm() -> AsyncIterator[list[DhtMembership]]:
    first = await DhtMembership.create(DhtConfig(new_swarm=True, **FAST))
    members = [first]
    try:
        members += [await join(first), await join(first)]
        yield members
    finally:
        for member in members:
            await member.aclose()


async def test_three_nodes_see_all_records(swarm: list[DhtMembership]) -> None:
    expiration = swarm[0].now() + 30
    for index, member in enumerate(swarm):
        assert await member.store(KEY, f"peer-{index}", b"record %d" % index, expiration_time=expiration)

    views = [await member.get_all(KEY) for member in swarm]

    expected = {f"peer-{index}": (b"record %d" % index, expiration) for index in range(3)}
    assert views == [expected] * 3
    assert await swarm[1].get_all("run/nobody/peers") == {}


async def test_expired_record_is_not_stored_nor_returned(swarm: list[DhtMembership]) -> None:
    now = swarm[0].now()

    live_ok = await swarm[0].store(KEY, "live", b"alive", expiration_time=now + 30)
    stale_ok = await swarm[0].store(KEY, "stale", b"gone", expiration_time=now - 1)
    view = await swarm[1].get_all(KEY)

    assert (live_ok, stale_ok) == (True, False)
    assert set(view) == {"live"}


async def test_withdraw_hides_subkey_from_other_nodes(swarm: list[DhtMembership]) -> None:
    first, second, third = swarm
    now = first.now()
    assert await first.store(KEY, "leaving", b"bye", expiration_time=now + 30)
    assert await third.store(KEY, "staying", b"hi", expiration_time=now + 30)
    assert set(await second.get_all(KEY)) == {"leaving", "staying"}

    withdrawn = await first.withdraw(KEY, "leaving", expiration_time=now + 60)
    too_early = await third.withdraw(KEY, "staying", expiration_time=now + 10)

    assert (withdrawn, too_early) == (True, False)
    assert await second.get_all(KEY) == {"staying": (b"hi", now + 30)}
    assert await third.get_all(KEY) == {"staying": (b"hi", now + 30)}
    assert await second.get_entries(KEY) == ({"staying": (b"hi", now + 30)}, {"leaving"})


async def test_client_mode_node_stores_and_reads_through_the_swarm(swarm: list[DhtMembership]) -> None:
    client = await join(swarm[0], client_mode=True)
    try:
        expiration = client.now() + 30
        stored = await client.store(KEY, "client", b"from a client", expiration_time=expiration)
        seen_by_server = await swarm[2].get_all(KEY)
    finally:
        await client.aclose()

    assert stored
    assert seen_by_server == {"client": (b"from a client", expiration)}


async def test_get_all_skips_foreign_values_and_keys_are_prefixed() -> None:
    member = await DhtMembership.create(DhtConfig(new_swarm=True, max_value_bytes=16, **FAST))
    raw = await DHTNode.create(initial_peers=member.visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        expiration = member.now() + 30
        assert await member.store(KEY, "ours", b"signed record", expiration_time=expiration)
        foreign = [("number", 42), (7, b"int subkey"), ("big", b"x" * 17), ("text", "str")]
        for offset_s, (subkey, value) in enumerate(foreign, start=1):  # distinct expirations: hivemind
            assert await raw.store("gossamer/" + KEY, value, expiration + offset_s, subkey=subkey)  # sorts by them

        view = await member.get_all(KEY)
        raw_view = await raw.get("gossamer/" + KEY, latest=True)
    finally:
        await raw.shutdown()
        await member.aclose()

    assert view == {"ours": (b"signed record", expiration)}
    assert raw_view.value["ours"].value == b"signed record"


async def test_store_refuses_tombstone_and_oversized_values() -> None:
    member = await DhtMembership.create(DhtConfig(new_swarm=True, max_value_bytes=16, **FAST))
    try:
        expiration = member.now() + 30
        with pytest.raises(ValueError, match="tombstone"):
            await member.store(KEY, "peer", b"", expiration_time=expiration)
        with pytest.raises(ValueError, match="max_value_bytes"):
            await member.store(KEY, "peer", b"x" * 17, expiration_time=expiration)
        assert await member.get_all(KEY) == {}
    finally:
        await member.aclose()


async def test_unreachable_initial_peer_raises_bootstrap_failed() -> None:
    before = p2pd_children()
    maddr = f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{MADE_UP_PEER_ID}"
    config = DhtConfig(initial_peers=(maddr,), bootstrap_timeout_s=2.0, request_timeout_s=2.0)

    with pytest.raises(BootstrapFailed) as caught:
        await DhtMembership.create(config)

    assert maddr in str(caught.value) and "--new_swarm" in str(caught.value)
    assert p2pd_children() == before


async def test_initial_peer_without_dht_raises_bootstrap_failed() -> None:
    before = p2pd_children()
    bare = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])  # reachable, but runs no DHT
    try:
        maddrs = tuple(str(maddr) for maddr in await bare.get_visible_maddrs())
        with pytest.raises(BootstrapFailed) as caught:
            await DhtMembership.create(DhtConfig(initial_peers=maddrs, **FAST))
    finally:
        await bare.shutdown()

    assert "DHT ping" in str(caught.value)
    assert p2pd_children() == before


async def test_port_in_use_raises_dht_start_failed() -> None:
    before = p2pd_children()
    first = await DhtMembership.create(DhtConfig(new_swarm=True, **FAST))
    port = int(first.visible_maddrs()[0].split("/")[4])
    try:
        with pytest.raises(DhtStartFailed) as caught:
            await DhtMembership.create(DhtConfig(new_swarm=True, host_maddrs=(f"/ip4/127.0.0.1/tcp/{port}",)))
    finally:
        await first.aclose()

    assert f"port {port} is in use" in str(caught.value) and "/tcp/0" in str(caught.value)
    assert p2pd_children() == before


async def test_aclose_stops_p2pd_and_is_idempotent() -> None:
    before = p2pd_children()
    member = await DhtMembership.create(DhtConfig(new_swarm=True, **FAST))
    running = p2pd_children() - before

    await member.aclose()
    await member.aclose()

    assert len(running) == 1
    assert p2pd_children() == before
    with pytest.raises(TransportError, match="closed"):
        await member.get_all(KEY)


PEER = f"/ip4/127.0.0.1/tcp/31337/p2p/{MADE_UP_PEER_ID}"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_peers": ("/ip4/1.2.3.4/tcp",)},
         "initial_peers: '/ip4/1.2.3.4/tcp' is not a valid multiaddr; expected /ip4/HOST/tcp/PORT/p2p/PEERID"),
        ({"initial_peers": ("/ip4/1.2.3.4/tcp/5",)}, "initial_peers: '/ip4/1.2.3.4/tcp/5' lacks the /p2p/PEERID"),
        ({"initial_peers": PEER}, "initial_peers: must be a tuple"),
        ({"initial_peers": (PEER,), "host_maddrs": ("nonsense",)}, "host_maddrs: 'nonsense' is not a valid"),
        ({"initial_peers": (PEER,), "host_maddrs": ()}, "host_maddrs: give at least one"),
        ({"initial_peers": (PEER,), "announce_maddrs": ("/ip4/1.2.3.4/tcp/0",)}, "announce_maddrs: .* port 0"),
        ({}, "initial_peers: empty; pass --new_swarm to start a new network, or --initial_peers to join one"),
        ({"new_swarm": True, "initial_peers": (PEER,)}, "initial_peers: must be empty with new_swarm=True"),
        ({"new_swarm": True, "bootstrap_timeout_s": 0}, "bootstrap_timeout_s: must be a positive"),
        ({"new_swarm": True, "request_timeout_s": float("nan")}, "request_timeout_s: must be a positive"),
        ({"new_swarm": True, "max_value_bytes": -1}, "max_value_bytes: must be a positive"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        DhtConfig(**kwargs)


def test_valid_configs_are_accepted() -> None:
    assert DhtConfig(new_swarm=True).initial_peers == ()
    assert DhtConfig(initial_peers=(PEER,), announce_maddrs=("/ip4/1.2.3.4/tcp/31337",)).initial_peers == (PEER,)
