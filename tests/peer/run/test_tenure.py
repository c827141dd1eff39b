"""Tenure and the per-read bound of the peer view, with real signed records and a clock we hold:
who has been live long enough to steer, what the run owner vouches for, and how many records a
read verifies when thousands of fresh identities publish valid ones."""

from __future__ import annotations

import dataclasses

from gossamer.crypto.identity import Identity
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.manifest import RunConfig, build_manifest
from gossamer.peer.run.records import MAX_TENURED, TENURED_ID_HEX, PeerRecord, open_record, seal_record
from gossamer.peer.run.tenure import seniors, steering, tenured_ids
from gossamer.peer.run.view import LivePeer, PeerView

T0 = 1_800_000_000.0
OWNER = Identity.generate()
MANIFEST = build_manifest(OWNER, RunConfig(name="open", heartbeat_s=10.0, tenure_s=100.0), now=T0)
TTL = MANIFEST.ttl_s


def record(identity: Identity, at: float, **changes) -> PeerRecord:
    base = PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name="p", http_addr="", tcp_addr="",
                      roles=("learner",), version="x", round=0, timestamp=at)
    return dataclasses.replace(base, **changes)


def entries(identities: list[Identity], at: float) -> dict[str, tuple[bytes, float]]:
    return {i.peer_id: (seal_record(i, record(i, at)), at + TTL) for i in identities}


def view(**options) -> PeerView:
    return PeerView(Admission(MANIFEST), ttl_s=TTL, **options)


def test_tenure_counts_from_first_sight_and_restarts_after_an_absence() -> None:
    a, b = Identity.generate(), Identity.generate()
    table = view()
    table.update(entries([a], T0), now=T0, withdrawn=())
    for step in range(1, 12):  # a heartbeat every 10 s; b joins at T0 + 50
        at = T0 + 10 * step
        table.update(entries([a, b] if step >= 5 else [a], at), now=at, withdrawn=())
    now = T0 + 110

    assert {p.record.peer_id: p.since for p in table.live(now=now)} == {a.peer_id: T0, b.peer_id: T0 + 50}
    assert tenured_ids(table.live(now=now), now=now, tenure_s=MANIFEST.tenure_s) == (a.peer_id[:TENURED_ID_HEX],)
    table.update(entries([b], now + 10), now=now + 10, withdrawn={a.peer_id})  # a leaves...
    table.update(entries([a, b], now + 20), now=now + 20, withdrawn=())  # ...and comes back
    assert table.get(a.peer_id).since == now + 20


def test_only_tenured_peers_steer_unless_none_is() -> None:
    old, new = Identity.generate(), [Identity.generate() for _ in range(20)]
    table = view()
    table.update(entries([old], T0), now=T0, withdrawn=())
    now = T0 + 100
    table.update(entries([old, *new], now), now=now, withdrawn=())
    live = table.live(now=now)

    chosen = steering(live, now=now, tenure_s=MANIFEST.tenure_s, owner=None)
    only_new = steering([p for p in live if p.record.peer_id != old.peer_id], now=now, tenure_s=MANIFEST.tenure_s,
                        owner=None)

    assert [p.record.peer_id for p in chosen] == [old.peer_id]
    assert len(only_new) == 20  # nobody is tenured yet (a run's first minutes): every candidate counts


def test_a_joiner_with_no_history_follows_the_peers_the_owner_vouches_for() -> None:
    honest, new = [Identity.generate() for _ in range(2)], [Identity.generate() for _ in range(20)]
    now = T0 + 1000
    vouched = tuple(i.peer_id[:TENURED_ID_HEX] for i in honest)
    owner_blob = seal_record(OWNER, record(OWNER, now, roles=("orchestrator",), tenured=vouched))
    owner = open_record(owner_blob, subkey=OWNER.peer_id, now=now, ttl_s=TTL)
    joiner_view = view()  # first read: every peer is new to the joiner
    joiner_view.update(entries([*honest, *new], now), now=now, withdrawn=())

    chosen = steering(joiner_view.live(now=now), now=now, tenure_s=MANIFEST.tenure_s, owner=owner)

    assert sorted(p.record.peer_id for p in chosen) == sorted(i.peer_id for i in honest)


def test_the_owner_vouches_for_at_most_max_tenured_peers_longest_first() -> None:
    peers = [Identity.generate() for _ in range(MAX_TENURED + 5)]
    table, found = view(max_verify=len(peers)), {}
    for k, identity in enumerate(peers):  # one more peer every 0.1 s, all within one TTL
        found[identity.peer_id] = (seal_record(identity, record(identity, T0 + k / 10)), T0 + TTL)
        table.update(dict(found), now=T0 + k / 10, withdrawn=())
    last = T0 + (len(peers) - 1) / 10
    everyone_tenured = last + MANIFEST.tenure_s

    vouched = tenured_ids(table.live(now=last), now=everyone_tenured, tenure_s=MANIFEST.tenure_s)

    assert vouched == tuple(p.peer_id[:TENURED_ID_HEX] for p in peers[:MAX_TENURED])


def test_a_read_verifies_a_bounded_number_of_records_known_peers_first() -> None:
    honest, flood = [Identity.generate() for _ in range(3)], [Identity.generate() for _ in range(2000)]
    table = view(max_verify=10)
    table.update(entries(honest, T0), now=T0, withdrawn=())
    now = T0 + 5
    flooded = {**entries(flood, T0 + 1), **entries(honest, now)}  # the honest peers republished

    table.update(flooded, now=now, withdrawn=())
    first = {p.record.peer_id for p in table.live(now=now)}
    first_deferred = table.deferred
    table.update(flooded, now=now, withdrawn=())  # the same bytes again: only new subkeys cost a check

    assert {i.peer_id for i in honest} <= first and len(first) == 10
    assert first_deferred == len(flood) - 7
    assert len(table.live(now=now)) == 20 and table.deferred == len(flood) - 17


def test_contributors_steer_and_peers_merely_present_for_long_do_not() -> None:
    """Issue 30 (6): six identities live for far longer than the tenure, but whose work this peer
    never used, do not steer it once it has contributors; the tenured contributors do."""
    honest, sybils = [Identity.generate() for _ in range(2)], [Identity.generate() for _ in range(6)]
    live = [LivePeer(record(i, T0), last_seen=T0 + 1000, since=T0) for i in honest + sybils]
    now = T0 + 1000

    assert len(steering(live, now=now, tenure_s=100.0, owner=None)) == 8  # presence alone: all of them
    chosen = steering(live, now=now, tenure_s=100.0, owner=None, contributed={i.peer_id for i in honest})
    assert sorted(p.record.peer_id for p in chosen) == sorted(i.peer_id for i in honest)
    gone = steering(live, now=now, tenure_s=100.0, owner=None, contributed={"nobody"})
    assert len(gone) == 8  # no contributor among the candidates: tenure decides, as before


def test_seniors_needs_no_clock_and_counts_the_vouched() -> None:
    old, young, vouched = Identity.generate(), Identity.generate(), Identity.generate()
    live = [LivePeer(record(old, T0), last_seen=T0 + 60, since=T0),
            LivePeer(record(young, T0), last_seen=T0 + 60, since=T0 + 30),
            LivePeer(record(vouched, T0), last_seen=T0 + 60, since=T0 + 59)]

    assert [p.record.peer_id for p in seniors(live, tenure_s=60.0)] == [old.peer_id]
    picked = seniors(live, tenure_s=60.0, vouched=(vouched.peer_id[:TENURED_ID_HEX],))
    assert [p.record.peer_id for p in picked] == [old.peer_id, vouched.peer_id]
    assert len(seniors(live[1:], tenure_s=60.0)) == 2  # none is tenured: all count
