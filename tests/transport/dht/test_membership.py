"""DhtMembership against real hivemind DHT nodes on 127.0.0.1: records, expiry, withdrawal, client mode,
foreign values skipped, aclose stops p2pd."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hivemind.dht.node import DHTNode

from gossamer.transport.dht.config import DhtConfig
from gossamer.transport.dht.membership import DhtMembership
from gossamer.transport.errors import TransportError
from tests.transport.dht.support import FAST, KEY, join, p2pd_children


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
