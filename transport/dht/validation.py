"""``EntryValidator``: the hivemind record validator every gossamer DHT node runs. A record passes
only as a signed entry under its signer's subkey, for the key it was found under, within its
signed expiry and the caller's ``KeyRule``s; verified digests are remembered (README.md, "The validator")."""

from __future__ import annotations

import hashlib
import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase

from gossamer.crypto.errors import VerificationError
from gossamer.crypto.signed import unpack_limited
from gossamer.transport.dht.entries import ENTRY_OVERHEAD_BYTES, Entry, EntryRefused, open_entry, read_entry
from gossamer.transport.dht.records import KEY_PREFIX

log = logging.getLogger(__name__)

MAX_SUBKEY_BYTES = 128
DEFAULT_CACHE_ENTRIES = 8192


class KeyRule(Protocol):
    """What the layer above says about its keys (given without the ``gossamer/`` prefix).

    ``check`` runs on every entry stored or read and raises ``EntryRefused`` for one that may not
    stand under ``key``; it must not depend on the time or on who is admitted, as hivemind drops a
    node's whole answer for one refused subkey. ``admit`` runs when this node is asked to store an
    entry: it raises ``EntryRefused`` for one this node must not keep (a record that fails
    verification or admission), returns True for a key of a run this node is part of and False
    for a key it cannot judge (kept within the strangers' quota, ``storage.StorageLimits``)."""

    def check(self, key: str, entry: Entry) -> None: ...

    def admit(self, key: str, entry: Entry, *, now: float) -> bool: ...


class EntryValidator(RecordValidatorBase):
    """Accepts only signed entries under their signer's subkey (see the module docstring)."""

    def __init__(self, *, max_payload_bytes: int, max_lifetime_s: float, max_clock_skew_s: float,
                 rules: Sequence[KeyRule] = (), now: Callable[[], float],
                 cache_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        self._max_payload_bytes = max_payload_bytes
        self._max_lifetime_s = max_lifetime_s
        self._max_clock_skew_s = max_clock_skew_s
        self._rules = tuple(rules)
        self._now = now
        self._cache_entries = cache_entries
        self._verified: OrderedDict[bytes, None] = OrderedDict()  # digests of verified entries
        self.refused: Counter[str] = Counter()
        self.verifications = 0

    def validate(self, record: DHTRecord) -> bool:
        try:
            self.entry(record.key, record.subkey, record.value, record.expiration_time)
        except EntryRefused as exc:
            self.refused[exc.reason] += 1
            log.debug("refused a DHT record: %s", exc)
            return False
        return True

    def entry(self, key_id: bytes, subkey_bytes: bytes, value_bytes: bytes, expiration_time: float) -> Entry:
        """The verified entry of one hivemind record (key hash, serialized subkey and value, expiration)."""
        if subkey_bytes in DHTProtocol.RESERVED_SUBKEYS:
            raise EntryRefused("a plain value (no subkey) under a gossamer key", reason="not-dictionary")
        subkey, blob = _decode(subkey_bytes, MAX_SUBKEY_BYTES), _decode(value_bytes,
                                                                       self._max_payload_bytes + ENTRY_OVERHEAD_BYTES)
        if not isinstance(subkey, str) or not isinstance(blob, bytes):
            raise EntryRefused("subkey is not a str or value is not bytes", reason="malformed")
        digest = hashlib.sha256(b"%d:%b%d:%b%b" % (len(key_id), key_id, len(subkey_bytes), subkey_bytes,
                                                   value_bytes)).digest()
        if digest not in self._verified:
            entry = open_entry(blob, subkey=subkey, max_payload_bytes=self._max_payload_bytes)
            self.verifications += 1
            self._check_placement(key_id, entry)
            self._remember(digest)
        else:
            self._verified.move_to_end(digest)
            entry = read_entry(blob, subkey=subkey, max_payload_bytes=self._max_payload_bytes)
        self._check_times(entry, expiration_time)
        return entry

    def place(self, key_id: bytes, subkey_bytes: bytes, value_bytes: bytes, expiration_time: float) -> tuple[Entry, bool]:
        """For the storage: the verified entry and whether every rule admits it as a member's
        (False: a stranger's); EntryRefused when it must not be stored."""
        entry = self.entry(key_id, subkey_bytes, value_bytes, expiration_time)
        key, now = entry.key[len(KEY_PREFIX):], self._now()
        verdicts = [rule.admit(key, entry, now=now) for rule in self._rules]  # every rule may refuse
        return entry, all(verdicts)

    def _check_placement(self, key_id: bytes, entry: Entry) -> None:
        if not entry.key.startswith(KEY_PREFIX) or DHTID.generate(source=entry.key).to_bytes() != key_id:
            raise EntryRefused(f"entry signed for key {entry.key[:80]!r} was found under another key", reason="key")
        lifetime_s = entry.expires_at - entry.signed_at
        if not 0 < lifetime_s <= self._max_lifetime_s:
            raise EntryRefused(f"entry lives {lifetime_s:.0f} s, over max_lifetime_s={self._max_lifetime_s:.0f}",
                               reason="lifetime")
        key = entry.key[len(KEY_PREFIX):]
        for rule in self._rules:
            rule.check(key, entry)

    def _check_times(self, entry: Entry, expiration_time: float) -> None:
        if not isinstance(expiration_time, int | float) or not math.isfinite(expiration_time):
            raise EntryRefused("expiration is not a finite time", reason="expiration")
        if expiration_time > entry.expires_at:
            raise EntryRefused(f"stored to expire {expiration_time - entry.expires_at:.0f} s after its signed "
                               f"expiration", reason="expiration")
        if entry.signed_at > self._now() + self._max_clock_skew_s:
            raise EntryRefused(f"entry signed {entry.signed_at - self._now():.0f} s in the future", reason="future")

    def _remember(self, digest: bytes) -> None:
        self._verified[digest] = None
        while len(self._verified) > self._cache_entries:
            self._verified.popitem(last=False)


def _decode(data: bytes, max_bytes: int) -> object:
    try:
        return unpack_limited(data, max_bytes=max_bytes)
    except VerificationError as exc:
        raise EntryRefused("subkey or value does not decode", reason="malformed") from exc

