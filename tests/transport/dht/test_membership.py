"""DhtMembership against real hivemind DHT nodes on 127.0.0.1: signed records, expiry, withdrawal,
client mode, foreign values refused by every node, aclose stops p2pd."""

from __future__ import annotations

import pytest
from hivemind.dht.node import DHTNode

from gossamer.crypto.identity import Identity
from gossamer.transport.dht.config import DhtConfig
from gossamer.transport.dht.entries import seal_entry
from gossamer.transport.dht.membership import DhtMembership
from gossamer.transport.errors import TransportError
from tests.transport.dht.support import FAST, KEY, join, p2pd_children

ALICE, BOB, CAROL = (Identity.generate() for _ in range(3))


async def test_three_nodes_see_all_records(swarm: list[DhtMembership]) -> None:
    expiration = swarm[0].now() + 30
    writers = (ALICE, BOB, CAROL)
    for index, (member, writer) in enumerate(zip(swarm, writers, strict=True)):
        assert await member.store(KEY, b"record %d" % index, signer=writer, expiration_time=expiration)

    views = [await member.get_all(KEY) for member in swarm]

    expected = {writer.peer_id: (b"record %d" % index, expiration) for index, writer in enumerate(writers)}
    assert views == [expected] * 3
    assert await swarm[1].get_all("run/nobody/peers") == {}


async def test_expired_record_is_not_stored_nor_returned(swarm: list[DhtMembership]) -> None:
    now = swarm[0].now()

    live_ok = await swarm[0].store(KEY, b"alive", signer=ALICE, expiration_time=now + 30)
    stale_ok = await swarm[0].store(KEY, b"gone", signer=BOB, expiration_time=now - 1)
    view = await swarm[1].get_all(KEY)

    assert (live_ok, stale_ok) == (True, False)
    assert set(view) == {ALICE.peer_id}


async def test_withdraw_hides_subkey_from_other_nodes(swarm: list[DhtMembership]) -> None:
    first, second, third = swarm
    now = first.now()
    assert await first.store(KEY, b"bye", signer=ALICE, expiration_time=now + 30)
    assert await third.store(KEY, b"hi", signer=CAROL, expiration_time=now + 30)
    assert set(await second.get_all(KEY)) == {ALICE.peer_id, CAROL.peer_id}

    withdrawn = await first.withdraw(KEY, signer=ALICE, expiration_time=now + 60)
    too_early = await third.withdraw(KEY, signer=CAROL, expiration_time=now + 10)

    assert (withdrawn, too_early) == (True, False)
    staying = {CAROL.peer_id: (b"hi", now + 30)}
    assert await second.get_all(KEY) == staying
    assert await third.get_all(KEY) == staying
    assert await second.get_entries(KEY) == (staying, {ALICE.peer_id})


async def test_client_mode_node_stores_and_reads_through_the_swarm(swarm: list[DhtMembership]) -> None:
    client = await join(swarm[0], client_mode=True)
    try:
        expiration = client.now() + 30
        stored = await client.store(KEY, b"from a client", signer=ALICE, expiration_time=expiration)
        seen_by_server = await swarm[2].get_all(KEY)
    finally:
        await client.aclose()

    assert stored
    assert seen_by_server == {ALICE.peer_id: (b"from a client", expiration)}


async def test_every_node_refuses_foreign_values_and_keys_are_prefixed(swarm: list[DhtMembership]) -> None:
    """A node without gossamer's validator writes what an attacker would; no honest node stores it
    (so it cannot hide, replace or pin an honest subkey), and no reader believes it when the
    attacker's own node serves it."""
    first, second, _third = swarm
    raw = await DHTNode.create(initial_peers=first.visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    try:
        now = first.now()
        assert await first.store(KEY, b"signed record", signer=ALICE, expiration_time=now + 30)
        found = await raw.get("gossamer/" + KEY, latest=True)
        alices_entry = found.value[ALICE.peer_id].value
        full = "gossamer/" + KEY
        later = now + 900
        foreign = [
            (full, ALICE.peer_id, seal_entry(BOB, key=full, payload=b"bob as alice", signed_at=now, expires_at=later)),
            (full, ALICE.peer_id, alices_entry),  # her own entry, replayed to expire later than she signed
            (full, ALICE.peer_id, b""),  # an unsigned tombstone
            (full, BOB.peer_id, seal_entry(BOB, key="gossamer/other", payload=b"elsewhere", signed_at=now,
                                           expires_at=later)),
            (full, BOB.peer_id, seal_entry(BOB, key=full, payload=b"for ever", signed_at=now, expires_at=now + 1e6)),
            (full, BOB.peer_id, seal_entry(BOB, key=full, payload=b"tomorrow", signed_at=now + 3600,
                                           expires_at=now + 3700)),
            (full, "number", 42), (full, 7, b"int subkey"), (full, "text", "str"), (full, BOB.peer_id, b"x" * 17),
            (full, None, b"a plain value over the whole key"),
        ]
        for offset_s, (key, subkey, value) in enumerate(foreign, start=1):  # distinct, later expirations
            await raw.store(key, value, later + offset_s, subkey=subkey)

        views = [await member.get_all(KEY) for member in swarm]
    finally:
        await raw.shutdown()

    assert views == [{ALICE.peer_id: (b"signed record", now + 30)}] * 3
    assert sum(first.refused.values()) + sum(second.refused.values()) >= len(foreign)
    assert {"subkey", "expiration", "not-dictionary", "key", "lifetime", "future"} <= set(first.refused)


async def test_store_refuses_tombstone_oversized_and_long_lived_values() -> None:
    member = await DhtMembership.create(DhtConfig(new_swarm=True, max_value_bytes=16, max_lifetime_s=60, **FAST))
    try:
        expiration = member.now() + 30
        with pytest.raises(ValueError, match="tombstone"):
            await member.store(KEY, b"", signer=ALICE, expiration_time=expiration)
        with pytest.raises(ValueError, match="max_value_bytes"):
            await member.store(KEY, b"x" * 17, signer=ALICE, expiration_time=expiration)
        with pytest.raises(ValueError, match="max_lifetime_s"):
            await member.store(KEY, b"x", signer=ALICE, expiration_time=expiration + 60)
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
