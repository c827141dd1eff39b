"""The DHT tests' shared fixture: three real hivemind nodes on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gossamer.transport.dht.config import DhtConfig
from gossamer.transport.dht.membership import DhtMembership
from tests.transport.dht.support import FAST, join


@pytest.fixture
async def swarm() -> AsyncIterator[list[DhtMembership]]:
    """A new swarm's first node and two that joined through it."""
    first = await DhtMembership.create(DhtConfig(new_swarm=True, **FAST))
    members = [first]
    try:
        members += [await join(first), await join(first)]
        yield members
    finally:
        for member in members:
            await member.aclose()
