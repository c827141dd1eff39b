"""``BoundedStorage``: what a gossamer DHT node keeps for others, within a byte budget and quotas per
signer and per key; keys the rules cannot judge (runs this node is not part of) share a small pool
for a short time. Refusals and evictions are counted by reason (README.md, "Storage")."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

from hivemind.dht.routing import DHTID, Subkey
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.utils.serializer import MSGPackSerializer
from hivemind.utils.timed_storage import ValueWithExpiration

from gossamer.transport.dht.entries import Entry, EntryRefused

KIB, MIB = 1024, 1024 * 1024
SLOT_OVERHEAD_BYTES = 256
"""What one stored subkey costs beyond its value and subkey bytes (Python objects, indexes), as counted."""


@dataclass(frozen=True, kw_only=True)
class StorageLimits:
    """What one DHT node stores for others, at most. hivemind answers a read, and hands a new
    neighbour what it should store, in one message of at most 4 MiB: ``key_bytes`` and
    ``handover_bytes`` stay below that, or a node holding more stops being readable.

    Attributes:
        budget_bytes: everything stored, counted as value + subkey + ``SLOT_OVERHEAD_BYTES``.
        signer_bytes: what one signer (a subkey: its peer id) holds over all keys.
        key_entries: subkeys one key of a run this node is part of holds (a run's peers, at most).
        key_bytes: bytes such a key holds.
        stranger_bytes: everything kept for keys no rule can judge (runs this node is not in).
        stranger_key_entries: subkeys one such key holds.
        stranger_key_bytes: bytes one such key holds (a manifest fits).
        stranger_lifetime_s: the longest such an entry is kept, whatever its signed expiration.
        handover_bytes: what a newly met neighbour is handed to store at most (members' keys first).
    """

    budget_bytes: int = 8 * MIB
    signer_bytes: int = 128 * KIB
    key_entries: int = 1024
    key_bytes: int = 3 * MIB
    stranger_bytes: int = 1 * MIB
    stranger_key_entries: int = 8
    stranger_key_bytes: int = 64 * KIB
    stranger_lifetime_s: float = 60.0
    handover_bytes: int = 3 * MIB

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"storage.{field.name}: must be a positive finite number, got {value!r}")
        if self.stranger_bytes > self.budget_bytes:
            raise ValueError(f"storage.stranger_bytes: {self.stranger_bytes} is over budget_bytes={self.budget_bytes}; "
                             f"lower it or raise the budget")


Place = Callable[[bytes, bytes, bytes, float], tuple[Entry, bool]]
"""(key id, serialized subkey, serialized value, expiration) -> (the verified entry, whether its key
is a member's: a run this node is part of); raises EntryRefused for what must not be stored."""


@dataclass(slots=True)
class _Slot:
    value: bytes
    expiration: float
    size: int
    stranger: bool
    order: int = 0  # matches this slot's entries in the expiry heaps (older ones there are stale)


class BoundedStorage(DHTLocalStorage):
    """hivemind's local storage of dictionary values, within ``StorageLimits`` (module docstring).

    A subkey is replaced, as in hivemind, only by a value that expires later. A new entry that
    would go over a quota is refused; over the budget, a member's entry evicts strangers' entries
    (those expiring soonest first), a stranger's is refused. A tombstone (an empty payload) is kept
    only in place of its signer's entry. ``get`` and ``items`` hand out copies: hivemind merges what
    other nodes answer into the dictionary a read starts from, which must not be the stored one.
    """

    def __init__(self, limits: StorageLimits, *, place: Place, now: Callable[[], float]) -> None:
        super().__init__()
        self.limits = limits
        self._place = place
        self._now = now
        self._keys: dict[DHTID, dict[Subkey, _Slot]] = {}
        self._key_bytes: Counter[DHTID] = Counter()
        self._signer_bytes: Counter[Subkey] = Counter()
        self._expiring: list[tuple[float, int, DHTID, Subkey]] = []  # lazy: checked against the slot when popped
        self._strangers: list[tuple[float, int, DHTID, Subkey]] = []  # the same, strangers' entries only
        self._order = itertools.count()
        self.entries = 0
        self.used_bytes = 0
        self.stranger_used_bytes = 0
        self.refused: Counter[str] = Counter()
        self.evicted: Counter[str] = Counter()

    # -- what hivemind calls ---------------------------------------------------------------------

    def store(self, key: DHTID, value: bytes, expiration_time: float, subkey: Subkey | None = None) -> bool:
        """Only dictionary entries are kept (gossamer stores nothing else; the validator refuses it)."""
        if subkey is None:
            return False
        return self.store_subkey(key, subkey, value, expiration_time)

    def store_subkey(self, key: DHTID, subkey: Subkey, value: bytes, expiration_time: float) -> bool:
        """Keep ``subkey`` -> ``value`` under ``key`` until ``expiration_time`` (shortened for a
        stranger); False if refused (counted by reason) or an entry expiring later holds the subkey."""
        now = self._now()
        self._expire(now)
        if not isinstance(value, bytes) or not isinstance(expiration_time, int | float) or expiration_time <= now:
            return False
        held = self._keys.get(key, {}).get(subkey)
        if held is not None and held.expiration >= expiration_time:
            return False  # hivemind's rule: the entry expiring latest stays (checked before any signature)
        try:
            entry, member = self._place(key.to_bytes(), MSGPackSerializer.dumps(subkey), value, expiration_time)
        except EntryRefused as exc:
            self.refused[exc.reason] += 1
            return False
        expiration = float(expiration_time) if member else min(float(expiration_time),
                                                               now + self.limits.stranger_lifetime_s)
        if held is not None and held.expiration >= expiration:
            return False
        size = len(value) + len(MSGPackSerializer.dumps(subkey)) + SLOT_OVERHEAD_BYTES
        reason = self._over_quota(key, subkey, held, size=size, stranger=not member, tombstone=entry.tombstone)
        if reason is None and not self._make_room(size - (held.size if held else 0), stranger=not member):
            reason = "budget"
        if reason is not None:
            self.refused[reason] += 1
            return False
        self._put(key, subkey, _Slot(value=value, expiration=expiration, size=size, stranger=not member))
        return True

    def get(self, key: DHTID) -> ValueWithExpiration[DictionaryDHTValue] | None:
        """A copy of the live entries under ``key`` (None when there is none)."""
        self._expire(self._now())
        slots = self._keys.get(key)
        if not slots:
            return None
        value = DictionaryDHTValue()
        with value.freeze():  # expiry is this storage's business, on its own clock
            for subkey, slot in slots.items():
                value.store(subkey, slot.value, slot.expiration)
        return ValueWithExpiration(value, value.latest_expiration_time)

    def items(self) -> Iterator[tuple[DHTID, ValueWithExpiration[DictionaryDHTValue]]]:
        """What hivemind hands a newly met neighbour: copies of whole keys, members' keys first, at
        most ``handover_bytes`` in all (one message of hivemind's carries it)."""
        self._expire(self._now())
        order = sorted(self._keys, key=lambda key: (self._is_stranger_key(key), self._key_bytes[key]))
        budget = self.limits.handover_bytes
        for key in order:
            if self._key_bytes[key] <= budget:
                found = self.get(key)
                if found is not None:
                    budget -= self._key_bytes[key]
                    yield key, found

    def top(self) -> tuple[DHTID | None, ValueWithExpiration[DictionaryDHTValue] | None]:
        """The key whose earliest entry expires first, and its entries."""
        self._expire(self._now())
        if not self._keys:
            return None, None
        key = min(self._keys, key=lambda k: min(slot.expiration for slot in self._keys[k].values()))
        return key, self.get(key)

    def __contains__(self, key: DHTID) -> bool:
        self._expire(self._now())
        return key in self._keys

    def __len__(self) -> int:
        self._expire(self._now())
        return len(self._keys)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __delitem__(self, key: DHTID) -> None:
        for subkey in list(self._keys.get(key, {})):
            self._drop(key, subkey)

    def clear(self) -> None:
        for key in list(self._keys):
            del self[key]

    # -- what gossamer reads -----------------------------------------------------------------------

    def usage(self) -> dict[str, int]:
        """Bytes and entries held, and the budget (``/status``, ``/metrics``)."""
        self._expire(self._now())
        return {"bytes": self.used_bytes, "stranger_bytes": self.stranger_used_bytes,
                "entries": self.entries, "keys": len(self._keys),
                "budget_bytes": self.limits.budget_bytes}

    # -- accounting --------------------------------------------------------------------------------

    def _over_quota(self, key: DHTID, subkey: Subkey, held: _Slot | None, *, size: int, stranger: bool,
                    tombstone: bool) -> str | None:
        """The reason a new entry of ``size`` bytes may not replace ``held`` (None: it may)."""
        limits = self.limits
        released = held.size if held is not None else 0
        if tombstone and held is None:
            return "tombstone"  # it would hide nothing here, and cost a slot
        if self._signer_bytes[subkey] - released + size > limits.signer_bytes:
            return "quota-signer"
        entries, key_bytes = ((limits.stranger_key_entries, limits.stranger_key_bytes) if stranger
                              else (limits.key_entries, limits.key_bytes))
        if held is None and len(self._keys.get(key, {})) >= entries:
            return "quota-key"
        if self._key_bytes[key] - released + size > key_bytes:
            return "quota-key"
        held_stranger = released if held is not None and held.stranger else 0
        if stranger and self.stranger_used_bytes - held_stranger + size > limits.stranger_bytes:
            return "quota-strangers"
        return None

    def _make_room(self, growth: int, *, stranger: bool) -> bool:
        """Whether ``growth`` more bytes fit the budget; a member's entry evicts strangers' to fit."""
        if self.used_bytes + growth <= self.limits.budget_bytes:
            return True
        if stranger or self.used_bytes - self.stranger_used_bytes + growth > self.limits.budget_bytes:
            return False
        while self.used_bytes + growth > self.limits.budget_bytes and self._strangers:
            _, order, key, subkey = heapq.heappop(self._strangers)
            slot = self._keys.get(key, {}).get(subkey)
            if slot is not None and slot.order == order:
                self._drop(key, subkey)
                self.evicted["budget"] += 1
        return self.used_bytes + growth <= self.limits.budget_bytes

    def _put(self, key: DHTID, subkey: Subkey, slot: _Slot) -> None:
        if subkey in self._keys.get(key, {}):
            self._drop(key, subkey)
        self._keys.setdefault(key, {})[subkey] = slot
        self.entries += 1
        self._key_bytes[key] += slot.size
        self._signer_bytes[subkey] += slot.size
        self.used_bytes += slot.size
        slot.order = next(self._order)
        heapq.heappush(self._expiring, (slot.expiration, slot.order, key, subkey))
        if slot.stranger:
            self.stranger_used_bytes += slot.size
            heapq.heappush(self._strangers, (slot.expiration, slot.order, key, subkey))
        self._compact()

    def _drop(self, key: DHTID, subkey: Subkey) -> None:
        slots = self._keys[key]
        slot = slots.pop(subkey)
        self.entries -= 1
        if not slots:
            del self._keys[key]
        for counter, name in ((self._key_bytes, key), (self._signer_bytes, subkey)):
            counter[name] -= slot.size
            if counter[name] <= 0:
                del counter[name]
        self.used_bytes -= slot.size
        if slot.stranger:
            self.stranger_used_bytes -= slot.size

    def _expire(self, now: float) -> None:
        while self._expiring and self._expiring[0][0] <= now:
            _, order, key, subkey = heapq.heappop(self._expiring)
            slot = self._keys.get(key, {}).get(subkey)
            if slot is not None and slot.order == order:
                self._drop(key, subkey)
        while self._strangers and self._strangers[0][0] <= now:
            heapq.heappop(self._strangers)

    def _compact(self) -> None:
        """Rebuild the expiry heaps once stale entries (of replaced or evicted slots) outnumber the
        live ones: a peer that replaces its entry again and again grows neither without bound."""
        if len(self._expiring) + len(self._strangers) <= 4 * self.entries + 2048:
            return
        live = [(slot.expiration, slot.order, key, subkey, slot.stranger) for key, slots in self._keys.items()
                for subkey, slot in slots.items()]
        self._expiring = [item[:4] for item in live]
        self._strangers = [item[:4] for item in live if item[4]]
        heapq.heapify(self._expiring)
        heapq.heapify(self._strangers)

    def _is_stranger_key(self, key: DHTID) -> bool:
        return all(slot.stranger for slot in self._keys.get(key, {}).values())


class RefusingCache(DHTLocalStorage):
    """hivemind's cache, which other nodes may fill (``in_cache`` stores) and a read fills with
    whatever it found: gossamer keeps nothing there (every read asks for the latest anyway).
    Each refusal is counted as ``cache`` in ``refused``."""

    def __init__(self, refused: Counter[str]) -> None:
        super().__init__()
        self.refused = refused

    def store(self, key: DHTID, value: object, expiration_time: float, subkey: Subkey | None = None) -> bool:
        self.refused["cache"] += 1
        return False

    def store_subkey(self, key: DHTID, subkey: Subkey, value: bytes, expiration_time: float) -> bool:
        self.refused["cache"] += 1
        return False
