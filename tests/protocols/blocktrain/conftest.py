"""The ``hosts`` fixture: block and stage hosts of one run behind real TCP servers, announced in a
real DHT node (``test_host.Hosts``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gossamer.transport.dht.config import DhtConfig
from gossamer.transport.dht.membership import DhtMembership
from tests.protocols.blocktrain.test_host import Hosts


@pytest.fixture
async def hosts(tmp_path: Path) -> AsyncIterator[Hosts]:
    membership = await DhtMembership.create(DhtConfig(new_swarm=True, host_maddrs=("/ip4/127.0.0.1/tcp/0",)))
    network = Hosts(tmp_path, membership)
    try:
        yield network
    finally:
        await network.aclose()
        await membership.aclose()
