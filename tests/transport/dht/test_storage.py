"""``BoundedStorage`` on an injected clock (no network): the byte budget, the quotas per signer, per
key and for strangers' keys, strangers' short lifetimes, eviction of strangers for members, and
that everything stored is accounted for once and freed when it expires."""

from __future__ import annotations

import time

import pytest
from hivemind.dht.routing import DHTID
from hivemind.utils.serializer import MSGPackSerializer

from gossamer.crypto.identity import Identity
from gossamer.transport.dht.entries import Entry, EntryRefused, seal_entry
from gossamer.transport.dht.records import KEY_PREFIX
from gossamer.transport.dht.storage import SLOT_OVERHEAD_BYTES, BoundedStorage, StorageLimits
from gossamer.transport.dht.validation import EntryValidator

MINE, OTHER = "run/mine@0123456789abcdef/peers", "run/other@0123456789abcdef/peers"
KIB = 1024


class Clock:
    """This storage's clock; it starts at the wall clock's time, which hivemind's dictionaries read
    (a dictionary handed out drops what has expired by then)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class MemberOf:
    """A key rule as the peer layer writes one: keys of the ``run/mine@...`` run are this node's,
    a payload starting with ``junk`` never verifies, every other key is a stranger's."""

    def check(self, key: str, entry: Entry) -> None:
        if entry.payload.startswith(b"junk"):
            raise EntryRefused("junk", reason="record")

    def admit(self, key: str, entry: Entry, *, now: float) -> bool:
        if entry.payload.startswith(b"unadmitted"):
            raise EntryRefused("not admitted", reason="admission")
        return key.startswith("run/mine@")


def storage(clock: Clock, **limits: float) -> BoundedStorage:
    validator = EntryValidator(max_payload_bytes=64 * KIB, max_lifetime_s=3600.0, max_clock_skew_s=30.0,
                               rules=(MemberOf(),), now=clock)
    return BoundedStorage(StorageLimits(**limits), place=validator.place, now=clock)


def put(store: BoundedStorage, clock: Clock, key: str, signer: Identity, payload: bytes, *,
        lifetime_s: float = 600.0) -> bool:
    expires = clock.now + lifetime_s
    blob = seal_entry(signer, key=KEY_PREFIX + key, payload=payload, signed_at=clock.now, expires_at=expires)
    return store.store_subkey(DHTID.generate(source=KEY_PREFIX + key), signer.peer_id, MSGPackSerializer.dumps(blob),
                              expires)


def key_id(key: str) -> DHTID:
    return DHTID.generate(source=KEY_PREFIX + key)


def test_members_entries_are_kept_for_their_lifetime_and_freed_when_they_expire() -> None:
    clock = Clock()
    store = storage(clock)
    alice = Identity.generate()

    assert put(store, clock, MINE, alice, b"a" * 1000, lifetime_s=600)

    found = store.get(key_id(MINE))
    assert found is not None and found.expiration_time == clock.now + 600
    assert store.usage()["bytes"] > 1000 and store.usage()["stranger_bytes"] == 0
    clock.now += 601
    assert store.get(key_id(MINE)) is None
    assert store.usage() == {"bytes": 0, "stranger_bytes": 0, "entries": 0, "keys": 0,
                             "budget_bytes": StorageLimits().budget_bytes}


def test_strangers_entries_live_briefly_and_share_a_small_pool() -> None:
    clock = Clock()
    store = storage(clock, stranger_bytes=8 * KIB, stranger_lifetime_s=60.0)
    signers = [Identity.generate() for _ in range(20)]

    kept = [put(store, clock, f"run/made-up-{index}@0123456789abcdef/peers", signer, b"s" * 1000, lifetime_s=1800)
            for index, signer in enumerate(signers)]

    assert 0 < sum(kept) < len(kept)
    assert store.usage()["stranger_bytes"] <= 8 * KIB
    assert store.refused["quota-strangers"] == len(kept) - sum(kept)
    assert max(store.get(key).expiration_time for key, _ in store.items()) <= clock.now + 60
    clock.now += 61
    assert store.usage()["entries"] == 0


def test_one_signer_cannot_hold_more_than_its_quota_over_all_keys() -> None:
    clock = Clock()
    store = storage(clock, signer_bytes=16 * KIB, stranger_bytes=1024 * KIB)
    mallory = Identity.generate()

    kept = [put(store, clock, f"run/made-up-{index}@0123456789abcdef/peers", mallory, b"m" * 4000)
            for index in range(10)]

    assert kept == [True] * 3 + [False] * 7
    assert store.refused["quota-signer"] == 7


def test_a_key_holds_a_bounded_number_of_entries_and_bytes() -> None:
    clock = Clock()
    store = storage(clock, key_entries=4, key_bytes=64 * KIB, stranger_key_entries=2)

    assert [put(store, clock, MINE, Identity.generate(), b"k" * 100) for _ in range(6)] == [True] * 4 + [False] * 2
    assert [put(store, clock, OTHER, Identity.generate(), b"k" * 100) for _ in range(3)] == [True] * 2 + [False]
    assert store.refused["quota-key"] == 3


def test_a_members_entry_evicts_strangers_when_the_budget_is_full() -> None:
    clock = Clock()
    probe = storage(clock)
    assert put(probe, clock, OTHER, Identity.generate(), b"s" * 2000)
    entry_size = probe.usage()["bytes"]  # the same for every entry of a 2000-byte payload
    assert entry_size > 2000 + SLOT_OVERHEAD_BYTES
    store = storage(clock, budget_bytes=4 * entry_size, stranger_bytes=4 * entry_size)
    for index in range(4):
        assert put(store, clock, f"run/s{index}@0123456789abcdef/peers", Identity.generate(), b"s" * 2000)
    assert not put(store, clock, "run/s9@0123456789abcdef/peers", Identity.generate(), b"s" * 2000)

    honest = Identity.generate()
    assert put(store, clock, MINE, honest, b"h" * 2000)

    assert store.evicted["budget"] == 1
    assert store.usage()["bytes"] <= 4 * entry_size
    assert honest.peer_id in dict(store.get(key_id(MINE)).value.items())


def test_what_fails_verification_or_admission_is_not_stored() -> None:
    clock = Clock()
    store = storage(clock)

    assert not put(store, clock, MINE, Identity.generate(), b"junk record")
    assert not put(store, clock, MINE, Identity.generate(), b"unadmitted record")

    assert store.usage()["entries"] == 0
    assert (store.refused["record"], store.refused["admission"]) == (1, 1)


def test_a_subkey_is_replaced_only_by_a_later_expiration_and_counted_once() -> None:
    clock = Clock()
    store = storage(clock)
    alice = Identity.generate()
    assert put(store, clock, MINE, alice, b"1" * 1000, lifetime_s=600)
    used = store.usage()["bytes"]

    assert not put(store, clock, MINE, alice, b"2" * 1000, lifetime_s=300)
    assert put(store, clock, MINE, alice, b"3" * 1000, lifetime_s=900)

    assert store.usage()["bytes"] == used and store.usage()["entries"] == 1
    for _ in range(5000):  # replacing again and again leaves no garbage behind
        clock.now += 0.001
        assert put(store, clock, MINE, alice, b"4" * 10, lifetime_s=900)
    assert len(store._expiring) <= 4 * store.entries + 2048


def test_a_tombstone_only_replaces_its_signers_entry() -> None:
    clock = Clock()
    store = storage(clock)
    alice = Identity.generate()

    assert not put(store, clock, MINE, alice, b"")
    assert store.refused["tombstone"] == 1
    assert put(store, clock, MINE, alice, b"record", lifetime_s=60)
    assert put(store, clock, MINE, alice, b"", lifetime_s=120)


def test_a_new_neighbour_is_handed_members_keys_first_within_the_handover_cap() -> None:
    clock = Clock()
    store = storage(clock, handover_bytes=6 * KIB)
    for index in range(4):
        assert put(store, clock, f"run/s{index}@0123456789abcdef/peers", Identity.generate(), b"s" * 2000)
    assert put(store, clock, MINE, Identity.generate(), b"h" * 2000)

    handed = [key for key, _ in store.items()]

    assert handed[0] == key_id(MINE) and len(handed) == 2


def test_reads_get_a_copy_that_does_not_change_what_is_stored() -> None:
    clock = Clock()
    store = storage(clock)
    assert put(store, clock, MINE, Identity.generate(), b"h" * 100)

    found = store.get(key_id(MINE))
    found.value.store("intruder", b"x", clock.now + 10)

    assert "intruder" not in dict(store.get(key_id(MINE)).value.items())


@pytest.mark.parametrize("changes", [{"budget_bytes": 0}, {"stranger_lifetime_s": float("inf")},
                                     {"budget_bytes": 1024, "stranger_bytes": 2048}, {"key_entries": True}])
def test_limits_that_cannot_hold_are_refused_naming_the_field(changes: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(changes)) if "stranger_bytes" not in changes else "stranger_bytes"):
        StorageLimits(**changes)
