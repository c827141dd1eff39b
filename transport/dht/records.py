"""Reading gossamer's records out of hivemind's answers: prefixed keys, live payloads, tombstones;
every entry is unwrapped through the ``EntryValidator`` and only unexpired ``str`` subkeys are kept."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import ValueWithExpiration

from gossamer.transport.dht.entries import EntryRefused

if TYPE_CHECKING:
    from gossamer.transport.dht.validation import EntryValidator

KEY_PREFIX = "gossamer/"


def dht_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"key: must be a non-empty str, got {key!r}")
    return KEY_PREFIX + key


def read_entries(found: Any, *, key_id: bytes, validator: EntryValidator,
                 now: float) -> tuple[dict[str, tuple[bytes, float]], set[str]]:
    """(subkey -> (payload, expiration) of the live entries, the subkeys withdrawn by their writer)."""
    records: dict[str, tuple[bytes, float]] = {}
    withdrawn: set[str] = set()
    if not isinstance(found, ValueWithExpiration) or not isinstance(found.value, dict):
        return records, withdrawn
    for subkey, item in found.value.items():
        if not isinstance(subkey, str) or not isinstance(item, ValueWithExpiration):
            continue
        blob, expiration = item.value, item.expiration_time
        if not isinstance(blob, bytes) or not isinstance(expiration, int | float) or not math.isfinite(expiration):
            continue
        if expiration <= now:
            continue
        try:
            entry = validator.entry(key_id, *record_parts(subkey, blob), expiration)
        except EntryRefused:
            continue
        if entry.tombstone:
            withdrawn.add(subkey)
        else:
            records[subkey] = (entry.payload, float(expiration))
    return records, withdrawn


def record_parts(subkey: str, blob: bytes) -> tuple[bytes, bytes]:
    """The serialized subkey and value hivemind hands a validator for ``subkey`` -> ``blob``."""
    return MSGPackSerializer.dumps(subkey), MSGPackSerializer.dumps(blob)
