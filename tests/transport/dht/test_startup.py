"""Starting a DHT node that cannot join or listen: typed errors that say what to do, and no p2pd left
behind."""

from __future__ import annotations

import pytest
from hivemind.p2p import P2P

from gossamer.transport.dht.config import DhtConfig
from gossamer.transport.dht.membership import DhtMembership
from gossamer.transport.dht.startup import BootstrapFailed, DhtStartFailed
from tests.transport.dht.support import FAST, MADE_UP_PEER_ID, closed_port, p2pd_children


async def test_unreachable_initial_peer_raises_bootstrap_failed() -> None:
    before = p2pd_children()
    maddr = f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{MADE_UP_PEER_ID}"
    config = DhtConfig(initial_peers=(maddr,), bootstrap_timeout_s=20.0, request_timeout_s=5.0)

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
