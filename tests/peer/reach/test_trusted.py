"""``Reach.trusted``, whom the self-test asks and a volunteer relay keeps places for: the run owner,
a peer this daemon has seen live for the run's tenure, or one the owner's record vouches for;
never a peer that is merely new, whatever its record claims."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gossamer.crypto.identity import Identity
from gossamer.peer.reach.service import Reach
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.manifest import RunConfig, build_manifest
from gossamer.peer.run.records import TENURED_ID_HEX, seal_record
from gossamer.peer.run.view import PeerView
from gossamer.transport.http_client import HttpClient
from tests.peer.run.test_records import make_record

T0 = 1_800_000_000.0


async def test_the_owner_the_tenured_and_the_vouched_for_are_trusted_the_new_are_not() -> None:
    owner, old, new, vouched = (Identity.generate() for _ in range(4))
    admission = Admission(build_manifest(owner, RunConfig(name="trust"), now=T0))
    view, clock = PeerView(admission, ttl_s=60.0), [T0]

    def see(*who: Identity, tenured: tuple[str, ...] = ()) -> None:
        entries = {}
        for identity in who:
            record = replace(make_record(identity), timestamp=clock[0],
                             tenured=tenured if identity is owner else ())
            entries[identity.peer_id] = (seal_record(identity, record), clock[0] + 60.0)
        view.update(entries, now=clock[0])

    client = await HttpClient.create()
    try:
        reach = Reach(identity=Identity.generate(), admission=admission, ttl_s=60.0, now=lambda: clock[0],
                      http_client=client, view=view, view_refreshed=asyncio.Condition(),
                      direct_record=lambda: make_record(owner), announce=lambda: None, targets=lambda: [],
                      tenure_s=30.0, owner_id=owner.peer_id)
        see(old)
        clock[0] += 40.0
        see(old, new, vouched, owner)
        assert [reach.trusted(i.peer_id) for i in (owner, old, new, vouched)] == [True, True, False, False]
        see(old, new, vouched, owner, tenured=(vouched.peer_id[:TENURED_ID_HEX],))
        assert [reach.trusted(i.peer_id) for i in (new, vouched)] == [False, True]
        assert not reach.trusted(Identity.generate().peer_id)
    finally:
        await client.aclose()
