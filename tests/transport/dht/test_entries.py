"""Signed DHT entries and the record validator, one record at a time (no network): what passes, what
is refused and why, and that a repeated record costs no second signature check."""

from __future__ import annotations

import pytest
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord

from gossamer.crypto.identity import Identity
from gossamer.transport.dht.entries import Entry, EntryRefused, open_entry, seal_entry
from gossamer.transport.dht.records import record_parts
from gossamer.transport.dht.validation import EntryValidator

KEY = "gossamer/run/demo@0123456789abcdef/peers"
NOW = 1_000_000.0
ALICE, BOB = Identity.generate(), Identity.generate()


def key_id(key: str = KEY) -> bytes:
    return DHTID.generate(source=key).to_bytes()


def record(blob: bytes, *, subkey: str = ALICE.peer_id, expiration: float = NOW + 30, key: str = KEY) -> DHTRecord:
    subkey_bytes, value_bytes = record_parts(subkey, blob)
    return DHTRecord(key_id(key), subkey_bytes, value_bytes, expiration)


def entry(signer: Identity = ALICE, *, key: str = KEY, payload: bytes = b"record", signed_at: float = NOW,
          expires_at: float = NOW + 30) -> bytes:
    return seal_entry(signer, key=key, payload=payload, signed_at=signed_at, expires_at=expires_at)


class OnlyOwnerOfDemo:
    """A key rule as the peer layer writes one: only ALICE may write under the key."""

    def check(self, key: str, found: Entry) -> None:
        if found.subkey != ALICE.peer_id:
            raise EntryRefused(f"only alice writes {key}", reason="not-owner")

    def admit(self, key: str, found: Entry, *, now: float) -> bool:
        return True


def validator(**changes) -> EntryValidator:
    options = {"max_payload_bytes": 1024, "max_lifetime_s": 60.0, "max_clock_skew_s": 5.0, "now": lambda: NOW,
               **changes}
    return EntryValidator(**options)


def test_an_entry_under_its_signers_subkey_passes_and_opens() -> None:
    blob = entry(payload=b"hello")

    assert validator().validate(record(blob))
    opened = open_entry(blob, subkey=ALICE.peer_id, max_payload_bytes=1024)
    assert (opened.key, opened.payload, opened.expires_at, opened.tombstone) == (KEY, b"hello", NOW + 30, False)
    assert open_entry(entry(payload=b""), subkey=ALICE.peer_id, max_payload_bytes=1024).tombstone


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (lambda: record(entry(BOB), subkey=ALICE.peer_id), "subkey"),  # another key's entry under alice's subkey
        (lambda: record(entry(BOB), subkey="bob"), "subkey"),
        (lambda: record(entry(), expiration=NOW + 31), "expiration"),  # replayed to expire later than signed
        (lambda: record(entry(key="gossamer/elsewhere")), "key"),  # replayed under another key
        (lambda: record(entry(key="other/" + KEY), key="other/" + KEY), "key"),  # outside gossamer's prefix
        (lambda: record(entry(expires_at=NOW + 61), expiration=NOW + 30), "lifetime"),
        (lambda: record(entry(signed_at=NOW + 10, expires_at=NOW + 20), expiration=NOW + 20), "future"),
        (lambda: record(entry(payload=b"x" * 1025)), "size"),
        (lambda: record(entry(payload=b"x" * 3000)), "malformed"),  # over the cap before the signature is read
        (lambda: record(b"not an entry"), "malformed"),
        (lambda: record(b""), "malformed"),
        (lambda: DHTRecord(key_id(), DHTProtocol.IS_REGULAR_VALUE, record_parts("x", entry())[1], NOW + 30),
         "not-dictionary"),
        (lambda: DHTRecord(key_id(), DHTProtocol.IS_DICTIONARY, record_parts("x", entry())[1], NOW + 30),
         "not-dictionary"),
    ],
)
def test_refused_records_are_counted_by_reason(case, reason: str) -> None:
    checker = validator()

    assert not checker.validate(case())
    assert checker.refused == {reason: 1}


def test_a_tampered_entry_fails_its_signature() -> None:
    blob = bytearray(entry(payload=b"payload!"))
    blob[blob.index(b"payload!")] ^= 1
    checker = validator()

    assert not checker.validate(record(bytes(blob)))
    assert checker.refused == {"signature": 1}


def test_key_rules_are_applied_to_the_key_without_its_prefix() -> None:
    checker = validator(rules=(OnlyOwnerOfDemo(),))

    assert checker.validate(record(entry(ALICE)))
    assert not checker.validate(record(entry(BOB), subkey=BOB.peer_id))
    assert checker.refused == {"not-owner": 1}


def test_a_repeated_record_is_verified_once_but_its_expiration_checked_every_time() -> None:
    checker = validator()
    blob = entry()

    results = [checker.validate(record(blob)) for _ in range(100)]
    later = checker.validate(record(blob, expiration=NOW + 31))

    assert all(results) and not later
    assert checker.verifications == 1
    assert checker.refused == {"expiration": 1}


def test_the_verified_cache_is_bounded() -> None:
    checker = validator(cache_entries=4)
    blobs = [entry(payload=b"%d" % i) for i in range(6)]

    for blob in blobs + blobs:
        assert checker.validate(record(blob))

    assert checker.verifications == 12  # each was evicted before it came round again


def test_seal_entry_refuses_what_cannot_be_an_entry() -> None:
    with pytest.raises(TypeError, match="payload must be bytes"):
        seal_entry(ALICE, key=KEY, payload="text", signed_at=NOW, expires_at=NOW + 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expires_at: must be a finite DHT time"):
        seal_entry(ALICE, key=KEY, payload=b"x", signed_at=NOW, expires_at=float("inf"))
