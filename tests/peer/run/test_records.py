"""Signed peer records and the peer view: signing, forgery, expiry and admission, without sleeping."""

from __future__ import annotations

import dataclasses

import pytest

from gossamer.crypto.identity import Identity
from gossamer.crypto.signed import sign_object
from gossamer.crypto.tokens import issue_join_token
from gossamer.peer.errors import ConfigError, RecordRejected
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.manifest import RunConfig, build_manifest
from gossamer.peer.run.records import PeerRecord, open_record, seal_record
from gossamer.peer.run.view import PeerView

NOW = 1_800_000_000.0
TTL = 15.0


def make_record(identity: Identity, **changes) -> PeerRecord:
    record = PeerRecord(peer_id=identity.peer_id, public_key=identity.public_key, name="p", http_addr="127.0.0.1:1",
                        tcp_addr="127.0.0.1:2", roles=("learner",), version="0.1.0", round=3, timestamp=NOW,
                        capacity={"device": "cpu"})
    return dataclasses.replace(record, **changes)


def test_record_round_trip() -> None:
    me = Identity.generate()
    record = make_record(me)
    assert open_record(seal_record(me, record), subkey=me.peer_id, now=NOW + 1, ttl_s=TTL) == record


def test_a_record_of_an_earlier_version_without_run_round_reads_as_zero() -> None:
    me = Identity.generate()
    body = make_record(me).body()
    del body["run_round"]
    assert open_record(sign_object(me, body), subkey=me.peer_id, now=NOW + 1, ttl_s=TTL).run_round == 0


def test_a_peer_cannot_sign_another_peers_record() -> None:
    me, other = Identity.generate(), Identity.generate()
    with pytest.raises(ValueError):
        seal_record(me, make_record(other))


@pytest.mark.parametrize("case", ["forged_key", "wrong_subkey", "expired", "future", "tampered", "unsigned",
                                  "negative_round", "negative_run_round"])
def test_bad_records_are_rejected(case: str) -> None:
    me, mallory = Identity.generate(), Identity.generate()
    blob, subkey, now = seal_record(me, make_record(me)), me.peer_id, NOW
    if case == "forged_key":  # mallory signs a record claiming me's identity
        blob = sign_object(mallory, make_record(me).body())
    elif case == "wrong_subkey":
        subkey = mallory.peer_id
    elif case == "expired":
        now = NOW + TTL + 0.5
    elif case == "future":
        now = NOW - 120.0
    elif case == "tampered":
        blob = blob[:-70] + bytes([blob[-70] ^ 1]) + blob[-69:]
    elif case == "unsigned":
        blob = b"\x81\xa4body\xc4\x00"
    elif case.startswith("negative_"):  # seal_record would build it; a hostile peer signs the body itself
        blob = sign_object(me, {**make_record(me).body(), case.removeprefix("negative_"): -1})
    with pytest.raises(RecordRejected):
        open_record(blob, subkey=subkey, now=now, ttl_s=TTL)


def allowlist_admission(owner: Identity, allowed: Identity) -> Admission:
    config = RunConfig(name="r", policy="allowlist", allow=(allowed.public_key.hex(),))
    return Admission(build_manifest(owner, config, now=NOW))


def test_view_keeps_admitted_peers_and_counts_rejections() -> None:
    owner, allowed, outsider, with_token = (Identity.generate() for _ in range(4))
    admission = allowlist_admission(owner, allowed)
    token = issue_join_token(owner, run_id=admission._manifest.run_id, expires_at=NOW + 60,
                             peer_public_key=with_token.public_key, nonce=b"n" * 16)
    view = PeerView(admission, ttl_s=TTL)
    entries = {p.peer_id: (seal_record(p, make_record(p)), NOW + TTL) for p in (owner, allowed, outsider)}
    entries[with_token.peer_id] = (seal_record(with_token, make_record(with_token, join_token=token)), NOW + TTL)
    entries["garbage"] = (b"\x00garbage", NOW + TTL)

    view.update(entries, now=NOW + 1)

    live = {p.record.peer_id for p in view.live(now=NOW + 1)}
    assert live == {owner.peer_id, allowed.peer_id, with_token.peer_id}
    assert view.rejected == {"policy": 1, "signature": 1}
    assert view.live(now=NOW + TTL + 1) == []


def test_expired_join_token_is_not_admitted() -> None:
    owner, late = Identity.generate(), Identity.generate()
    admission = allowlist_admission(owner, owner)
    token = issue_join_token(owner, run_id=admission._manifest.run_id, expires_at=NOW - 1,
                             peer_public_key=None, nonce=b"n" * 16)
    with pytest.raises(RecordRejected) as info:
        admission.check(make_record(late, join_token=token), now=NOW)
    assert info.value.reason == "policy"


def tokens_for(owner: Identity, admission: Admission, peer: Identity) -> tuple[str, str]:
    """A token of the run bound to ``peer``'s key, and one bound to no key."""
    run_id = admission._manifest.run_id
    bound = issue_join_token(owner, run_id=run_id, expires_at=NOW + 60, peer_public_key=peer.public_key,
                             nonce=b"b" * 16)
    return bound, issue_join_token(owner, run_id=run_id, expires_at=NOW + 60, peer_public_key=None, nonce=b"u" * 16)


def test_a_token_read_from_a_public_record_admits_nobody_else() -> None:
    """Issue 10: a token lifted from a peer's public record admitted the attacker's key. A bound
    token copied into another record is refused, and a record carrying an unbound token is refused
    even for its holder (published, it is everyone's)."""
    owner, alice, mallory = Identity.generate(), Identity.generate(), Identity.generate()
    admission = allowlist_admission(owner, owner)
    bound, unbound = tokens_for(owner, admission, alice)

    admission.check(make_record(alice, join_token=bound), now=NOW)  # its holder is admitted
    refusals = []
    for record in (make_record(mallory, join_token=bound), make_record(alice, join_token=unbound),
                   make_record(mallory, join_token=unbound)):
        with pytest.raises(RecordRejected) as info:
            admission.check(record, now=NOW)
        refusals.append(info.value.reason)

    assert refusals == ["policy"] * 3


def test_a_daemon_refuses_to_publish_a_token_that_would_admit_whoever_reads_it() -> None:
    owner, alice, listed = Identity.generate(), Identity.generate(), Identity.generate()
    admission = allowlist_admission(owner, listed)
    bound, unbound = tokens_for(owner, admission, alice)

    admission.check_own_token(bound, public_key=alice.public_key, now=NOW)
    admission.check_own_token("", public_key=listed.public_key, now=NOW)  # admitted without one
    with pytest.raises(ConfigError, match="bound to no key.*--peer_public_key " + alice.public_key.hex()):
        admission.check_own_token(unbound, public_key=alice.public_key, now=NOW)
    with pytest.raises(ConfigError, match="not a valid token"):
        admission.check_own_token(bound, public_key=Identity.generate().public_key, now=NOW)


def test_a_partial_read_does_not_drop_unexpired_peers_but_a_withdrawal_or_expiry_does() -> None:
    owner, a, b = (Identity.generate() for _ in range(3))
    view = PeerView(Admission(build_manifest(owner, RunConfig(name="r"), now=NOW)), ttl_s=TTL)
    both = {p.peer_id: (seal_record(p, make_record(p)), NOW + TTL) for p in (a, b)}
    view.update(both, now=NOW + 1, withdrawn=set())

    view.update({a.peer_id: both[a.peer_id]}, now=NOW + 2, withdrawn=set())  # b's holder did not answer
    assert {p.record.peer_id for p in view.live(now=NOW + 2)} == {a.peer_id, b.peer_id}

    view.update({a.peer_id: both[a.peer_id]}, now=NOW + 3, withdrawn={b.peer_id})  # b left cleanly
    assert {p.record.peer_id for p in view.live(now=NOW + 3)} == {a.peer_id}

    view.update(both, now=NOW + 4, withdrawn=set())
    view.update({}, now=NOW + TTL + 1, withdrawn=set())  # nobody refreshed: both expire
    assert view.live(now=NOW + TTL + 1) == []


def test_a_one_off_read_is_exactly_what_it_found() -> None:
    owner, a, b = (Identity.generate() for _ in range(3))
    view = PeerView(Admission(build_manifest(owner, RunConfig(name="r"), now=NOW)), ttl_s=TTL)
    view.update({p.peer_id: (seal_record(p, make_record(p)), NOW + TTL) for p in (a, b)}, now=NOW + 1)

    view.update({a.peer_id: (seal_record(a, make_record(a)), NOW + TTL)}, now=NOW + 2)

    assert {p.record.peer_id for p in view.live(now=NOW + 2)} == {a.peer_id}


def test_an_older_record_does_not_replace_a_newer_one() -> None:
    owner, a = Identity.generate(), Identity.generate()
    view = PeerView(Admission(build_manifest(owner, RunConfig(name="r"), now=NOW)), ttl_s=TTL)
    view.update({a.peer_id: (seal_record(a, make_record(a, round=5, timestamp=NOW + 2)), NOW + TTL)}, now=NOW + 2,
                withdrawn=set())
    view.update({a.peer_id: (seal_record(a, make_record(a, round=4, timestamp=NOW + 1)), NOW + TTL)}, now=NOW + 3,
                withdrawn=set())
    assert view.get(a.peer_id).record.round == 5
