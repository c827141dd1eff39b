"""DHT storage floods against real hivemind nodes on 127.0.0.1 that apply the run key rule of one
run: an attacker's plain hivemind node stores validly signed records under made-up run keys, signed
junk, records of peers the run does not admit and oversized payloads under the run's peers key; what
the run's nodes hold stays within their quotas while the run's own records are stored and read."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.utils.serializer import MSGPackSerializer

from gossamer.crypto.identity import Identity
from gossamer.peer.run.keys import RunKeys, peers_key
from gossamer.peer.run.manifest import Manifest, RunConfig, build_manifest
from gossamer.peer.run.records import MAX_RECORD_BYTES, PeerRecord, seal_record
from gossamer.transport.dht import KEY_PREFIX, DhtConfig, DhtMembership
from gossamer.transport.dht.entries import seal_entry

pytestmark = pytest.mark.timeout(180)

FAST = {"bootstrap_timeout_s": 30.0, "request_timeout_s": 10.0, "host_maddrs": ("/ip4/127.0.0.1/tcp/0",)}
STRANGER_POOL_BYTES = 1024 * 1024  # StorageLimits.stranger_bytes: what a node keeps for runs it is not part of
STRANGER_LIFETIME_S = 60.0  # StorageLimits.stranger_lifetime_s
LIFETIME_S = 1800.0  # what the attacker asks for
BATCH = 20  # entries per store request: one hivemind message stays well under its 4 MiB cap


@dataclass
class Swarm:
    """Three nodes of the run (each knows its manifest) and the attacker's plain hivemind node."""

    members: list[DhtMembership]
    attacker: DHTNode
    manifest: Manifest

    @property
    def peers(self) -> str:
        return peers_key(self.manifest.run_id)


@pytest.fixture(params=["open"])
async def swarm(request: pytest.FixtureRequest) -> AsyncIterator[Swarm]:
    owner = Identity.generate()
    members: list[DhtMembership] = []
    attacker = None
    try:
        for _ in range(3):
            rules = RunKeys()
            initial = {"initial_peers": tuple(members[0].visible_maddrs())} if members else {"new_swarm": True}
            members.append(await DhtMembership.create(DhtConfig(**initial, **FAST), rules=(rules,)))
            manifest = build_manifest(owner, RunConfig(name="flooded", heartbeat_s=600.0, policy=request.param),
                                      now=members[0].now())
            rules.learn(manifest)
        attacker = await DHTNode.create(initial_peers=members[0].visible_maddrs(), host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                        wait_timeout=FAST["request_timeout_s"])
        yield Swarm(members=members, attacker=attacker, manifest=manifest)
    finally:
        if attacker is not None:
            await attacker.shutdown()
        for member in members:
            await member.aclose()


def held(member: DhtMembership) -> tuple[int, float]:
    """Value bytes this node's hivemind storage and cache hold for anyone (what a flood grows), and
    the latest expiration among them (0 if none)."""
    protocol = member._node.protocol
    total, latest = 0, 0.0
    for storage in (protocol.storage, protocol.cache):
        for _key, item in list(storage.items()):
            if isinstance(item.value, DictionaryDHTValue):
                for _subkey, sub in item.value.items():
                    total, latest = total + len(sub.value), max(latest, sub.expiration_time)
            else:
                total, latest = total + len(item.value), max(latest, item.expiration_time)
    return total, latest


def record_of(identity: Identity, now: float, *, pad_to: int = 0) -> bytes:
    """A valid, signed peer record of ``identity``, padded (in ``capacity``) to about ``pad_to`` bytes."""
    def sealed(pad: int) -> bytes:
        return seal_record(identity, PeerRecord(
            peer_id=identity.peer_id, public_key=identity.public_key, name="honest", http_addr="127.0.0.1:1",
            tcp_addr="", roles=("learner",), version="1", round=0, timestamp=now, capacity={"pad": "x" * pad}))
    blob = sealed(0)
    return sealed(pad_to - len(blob)) if pad_to > len(blob) else blob


async def attack(swarm: Swarm, entries: list[tuple[Identity, str, bytes]]) -> int:
    """The attacker asks every node of the run to store each (signer, key, payload) as a validly
    signed entry living LIFETIME_S (hivemind's store RPC, as any DHT member may); returns how many
    stores the nodes took."""
    now, stored = swarm.members[0].now(), 0
    for start in range(0, len(entries), BATCH):
        batch = entries[start:start + BATCH]
        full = [KEY_PREFIX + key for _signer, key, _payload in batch]
        values = [MSGPackSerializer.dumps(seal_entry(signer, key=key, payload=payload, signed_at=now,
                                                     expires_at=now + LIFETIME_S))
                  for (signer, _key, payload), key in zip(batch, full, strict=True)]
        for member in swarm.members:
            done = await swarm.attacker.protocol.call_store(
                member._p2p.peer_id, [DHTID.generate(source=key) for key in full], values,
                [now + LIFETIME_S] * len(full), subkeys=[signer.peer_id for signer, _key, _payload in batch])
            assert done is not None, "a node did not answer the attacker's store"
            stored += sum(done)
    return stored


def made_up_peers_keys(count: int) -> list[str]:
    """Keys of the accepted form ``run/<name>@<16 hex>/peers``, of runs nobody started."""
    return [f"run/made-up-{index}@{os.urandom(8).hex()}/peers" for index in range(count)]


async def store_honest(swarm: Swarm, via: int = 0) -> Identity:
    honest = Identity.generate()
    now = swarm.members[via].now()
    assert await swarm.members[via].store(swarm.peers, record_of(honest, now), signer=honest,
                                          expiration_time=now + 300)
    return honest


@pytest.mark.parametrize("signers", [1, 100])
async def test_a_flood_of_records_under_made_up_run_keys_stays_within_the_strangers_pool(
        swarm: Swarm, signers: int) -> None:
    honest = await store_honest(swarm)
    now = swarm.members[0].now()
    identities = [Identity.generate() for _ in range(signers)]
    records = {identity.peer_id: record_of(identity, now, pad_to=MAX_RECORD_BYTES - 256) for identity in identities}
    keys = made_up_peers_keys(300)  # 300 x ~16 KiB = 4.7 MiB offered, living 30 minutes
    stored = await attack(swarm, [(identities[index % signers], key, records[identities[index % signers].peer_id])
                                  for index, key in enumerate(keys)])

    for member in swarm.members:
        stored, latest = held(member)
        assert stored <= STRANGER_POOL_BYTES + 64 * 1024, f"a node holds {stored} bytes"
        assert latest <= member.now() + STRANGER_LIFETIME_S + 300, "a stranger's entry is kept for its full lifetime"
        assert member.storage_usage()["stranger_bytes"] <= STRANGER_POOL_BYTES
        assert set(await member.get_all(swarm.peers)) == {honest.peer_id}
    refused = [dict(member.refused) for member in swarm.members]
    assert sum(member.refused["quota-strangers"] + member.refused["quota-signer"] for member in swarm.members) > 0, \
        f"the flood never reached a quota: {refused}, {stored} stored"


async def test_signed_junk_under_the_runs_peers_key_is_refused_where_it_is_stored(swarm: Swarm) -> None:
    honest = await store_honest(swarm, via=1)

    await attack(swarm, [(Identity.generate(), swarm.peers, os.urandom(512)) for _ in range(200)])

    for member in swarm.members:
        assert held(member)[0] < 8 * 1024, "junk was stored"
        assert set(await member.get_all(swarm.peers)) == {honest.peer_id}, "a reader pulled junk"
    assert sum(member.refused["record"] for member in swarm.members) >= 200


@pytest.mark.parametrize("swarm", ["allowlist"], indirect=True)
async def test_records_of_peers_the_run_does_not_admit_are_refused_where_they_are_stored(swarm: Swarm) -> None:
    now = swarm.members[0].now()
    strangers = [Identity.generate() for _ in range(50)]

    await attack(swarm, [(identity, swarm.peers, record_of(identity, now)) for identity in strangers])

    for member in swarm.members:  # (the attacker's own node still answers reads with them; readers check admission)
        assert held(member)[0] == 0, "records of unadmitted peers were stored"
    assert sum(member.refused["admission"] for member in swarm.members) >= 50


async def test_a_payload_over_the_record_cap_is_refused_under_any_peers_key(swarm: Swarm) -> None:
    signer = Identity.generate()
    await attack(swarm, [(signer, key, os.urandom(60 * 1000)) for key in (swarm.peers, *made_up_peers_keys(20))])

    for member in swarm.members:
        assert held(member)[0] == 0
    assert sum(member.refused["size"] for member in swarm.members) >= 21
