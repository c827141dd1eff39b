"""Reading gossamer's records out of hivemind's answers: prefixed keys, live values, tombstones.

Anyone in the swarm can write any msgpack value under any key, so a read keeps only ``str``
subkeys holding non-empty ``bytes`` within the size cap that have not expired; an unexpired empty
value is a withdrawal tombstone.
"""

from __future__ import annotations

from typing import Any

from hivemind.utils.timed_storage import ValueWithExpiration

KEY_PREFIX = "gossamer/"


def dht_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"key: must be a non-empty str, got {key!r}")
    return KEY_PREFIX + key


def live_records(found: Any, *, now: float, max_value_bytes: int) -> dict[str, tuple[bytes, float]]:
    """Keep str subkeys holding non-empty bytes within the cap that have not expired."""
    if not isinstance(found, ValueWithExpiration) or not isinstance(found.value, dict):
        return {}
    records = {}
    for subkey, item in found.value.items():
        if not isinstance(subkey, str) or not isinstance(item, ValueWithExpiration):
            continue
        value, expiration = item.value, item.expiration_time
        if not isinstance(value, bytes) or not 0 < len(value) <= max_value_bytes:
            continue
        if isinstance(expiration, int | float) and expiration > now:
            records[subkey] = (value, float(expiration))
    return records


def withdrawn_subkeys(found: Any, *, now: float) -> set[str]:
    """The str subkeys holding an unexpired tombstone (``b""``)."""
    if not isinstance(found, ValueWithExpiration) or not isinstance(found.value, dict):
        return set()
    return {subkey for subkey, item in found.value.items()
            if isinstance(subkey, str) and isinstance(item, ValueWithExpiration) and item.value == b""
            and isinstance(item.expiration_time, int | float) and item.expiration_time > now}
