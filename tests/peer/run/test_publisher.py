"""A failed DHT store is an alarm, not a silent success: one warning per streak, a count for
``/metrics``, a quicker retry, and a line when it recovers (a real hivemind DHT node)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from gossamer.crypto.identity import Identity
from gossamer.peer.metrics import PeerMetrics, Snapshot
from gossamer.peer.run.publisher import RETRY_HEARTBEATS, Publisher, StoreLog
from gossamer.transport.dht import DhtConfig, DhtMembership

KEY = "run/alarm@0123456789abcdef/peers"
HEARTBEAT_S = 2.0


@pytest.fixture
async def membership() -> AsyncIterator[DhtMembership]:
    member = await DhtMembership.create(DhtConfig(new_swarm=True, host_maddrs=("/ip4/127.0.0.1/tcp/0",)))
    try:
        yield member
    finally:
        await member.aclose()


async def test_a_refused_store_warns_once_counts_retries_sooner_and_logs_the_recovery(
        membership: DhtMembership, caplog: pytest.LogCaptureFixture) -> None:
    me, log = Identity.generate(), StoreLog()
    publisher = Publisher(membership, what="record", key=KEY, signer=me, heartbeat_s=HEARTBEAT_S, store_log=log)
    now = membership.now()
    assert await membership.store(KEY, b"from my last run", signer=me, expiration_time=now + 60)  # expires later

    with caplog.at_level(logging.INFO, logger="gossamer.peer.run.publisher"):
        first = await publisher.publish(b"now", expiration_time=now + 30)
        second = await publisher.publish(b"now", expiration_time=now + 31)
        delay_while_failing = publisher.retry_delay_s
        third = await publisher.publish(b"now", expiration_time=now + 61)

    assert (first, second, third) == (False, False, True)
    assert delay_while_failing == HEARTBEAT_S * RETRY_HEARTBEATS and publisher.retry_delay_s == HEARTBEAT_S
    assert (log.failed["record"], log.refused["record"], log.stored["record"]) == (2, 2, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(warnings) == 1 and "could not store the record in the DHT" in warnings[0]
    assert infos == ["stored the record in the DHT again after 2 failed attempt(s)"]
    assert await membership.get_all(KEY) == {me.peer_id: (b"now", now + 61)}


def test_store_failures_dht_refusals_and_rejoins_are_exported() -> None:
    snapshot = Snapshot(uptime_s=1.0, live_peers=2, round=0, bytes_sent={}, bytes_received={}, records_rejected={},
                        dht_store_failures={"manifest": 3}, dht_refused={"subkey": 5}, dht_rejoined=2)

    text = PeerMetrics(lambda owner: snapshot).render().decode()

    assert 'gossamer_dht_store_failures_total{entry="manifest"} 3.0' in text
    assert 'gossamer_dht_refused_total{reason="subkey"} 5.0' in text
    assert "gossamer_dht_rejoined_total 2.0" in text
