"""``RunKeys``, the key rule of every daemon's DHT node, one entry at a time (no network): what it
refuses under any run's keys, what it stores only for the run it is part of, and when."""

from __future__ import annotations

import dataclasses

import pytest

from gossamer.crypto.identity import Identity
from gossamer.crypto.tokens import issue_join_token
from gossamer.peer.run.keys import RunKeys, manifest_key, peers_key
from gossamer.peer.run.manifest import RunConfig, build_manifest
from gossamer.peer.run.records import MAX_RECORD_BYTES, PeerRecord, seal_record
from gossamer.transport.dht import Entry, EntryRefused

NOW = 1_800_000_000.0
OWNER = Identity.generate()
OPEN = build_manifest(OWNER, RunConfig(name="open", heartbeat_s=5.0), now=NOW)
CLOSED = build_manifest(OWNER, RunConfig(name="closed", heartbeat_s=5.0, policy="allowlist"), now=NOW)
MADE_UP = "run/made-up@0123456789abcdef/peers"


def record(identity: Identity, **changes) -> bytes:
    return seal_record(identity, dataclasses.replace(PeerRecord(
        peer_id=identity.peer_id, public_key=identity.public_key, name="p", http_addr="127.0.0.1:1", tcp_addr="",
        roles=("learner",), version="1", round=0, timestamp=NOW), **changes))


def entry(signer: Identity, key: str, payload: bytes, *, lifetime_s: float = 10.0) -> Entry:
    return Entry(key="gossamer/" + key, subkey=signer.peer_id, payload=payload, signed_at=NOW,
                 expires_at=NOW + lifetime_s)


def rules(*manifests) -> RunKeys:
    keys = RunKeys()
    for manifest in manifests:
        keys.learn(manifest)
    return keys


@pytest.mark.parametrize("payload", [b"junk", b"x" * (MAX_RECORD_BYTES + 1)])
def test_what_is_not_a_record_is_refused_under_every_runs_peers_key(payload: bytes) -> None:
    mallory = Identity.generate()
    for key in (peers_key(OPEN.run_id), MADE_UP):
        with pytest.raises(EntryRefused) as refused:
            rules(OPEN).check(key, entry(mallory, key, payload))
        assert refused.value.reason == ("size" if len(payload) > MAX_RECORD_BYTES else "record")


def test_a_record_signed_by_another_key_than_the_entry_is_refused() -> None:
    alice, mallory = Identity.generate(), Identity.generate()
    with pytest.raises(EntryRefused, match="record"):
        rules(OPEN).check(MADE_UP, entry(mallory, MADE_UP, record(alice)))


def test_only_the_owners_signed_manifest_stands_under_the_manifest_key() -> None:
    key = manifest_key(OPEN.run_id)
    rules(OPEN).check(key, entry(OWNER, key, OPEN.blob))
    with pytest.raises(EntryRefused) as refused:
        rules(OPEN).check(key, entry(OWNER, key, b"junk"))
    assert refused.value.reason == "manifest"
    with pytest.raises(EntryRefused, match="owner"):
        rules(OPEN).check(key, entry(Identity.generate(), key, OPEN.blob))


def test_a_valid_record_of_another_run_is_a_strangers_not_a_members() -> None:
    sybil = Identity.generate()
    assert rules(OPEN).admit(MADE_UP, entry(sybil, MADE_UP, record(sybil)), now=NOW) is False
    assert rules().admit(peers_key(OPEN.run_id), entry(sybil, MADE_UP, record(sybil)), now=NOW) is False


def test_the_runs_records_are_stored_only_while_current_and_admitted() -> None:
    key, alice = peers_key(CLOSED.run_id), Identity.generate()
    keys = rules(CLOSED)
    assert keys.admit(key, entry(OWNER, key, record(OWNER)), now=NOW + 1) is True
    token = issue_join_token(OWNER, run_id=CLOSED.run_id, expires_at=NOW + 60, peer_public_key=alice.public_key,
                             nonce=b"n" * 16)
    assert keys.admit(key, entry(alice, key, record(alice, join_token=token)), now=NOW + 1) is True

    for identity, blob, now, reason in [
        (alice, record(alice), NOW + 1, "admission"),  # no token, not on the allowlist
        (OWNER, record(OWNER), NOW + 3 * 5.0 + 1, "record"),  # older than the run's record TTL
        (OWNER, record(OWNER, timestamp=NOW + 120), NOW, "record"),  # dated in the future
    ]:
        with pytest.raises(EntryRefused) as refused:
            keys.admit(key, entry(identity, key, blob), now=now)
        assert refused.value.reason == reason


def test_an_entry_of_the_run_lives_at_most_its_record_ttl_plus_skew() -> None:
    key, alice = peers_key(OPEN.run_id), Identity.generate()
    rules(OPEN).check(key, entry(alice, key, record(alice), lifetime_s=OPEN.ttl_s))
    with pytest.raises(EntryRefused, match="lifetime"):
        rules(OPEN).check(key, entry(alice, key, record(alice), lifetime_s=OPEN.ttl_s + 3600))
