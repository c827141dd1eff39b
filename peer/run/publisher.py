"""``Publisher``: keeping this peer's entries in the DHT (its record, the run's manifest). A failed
store is never a silent success: it is logged once per streak, counted per entry in ``StoreLog``
(``/metrics``) and retried after ``retry_delay_s``."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from gossamer.crypto.identity import Identity
from gossamer.transport.dht import DhtMembership
from gossamer.transport.errors import TransportError

log = logging.getLogger(__name__)

RETRY_HEARTBEATS = 0.25
"""A failed store is retried after this fraction of a heartbeat."""


@dataclass
class StoreLog:
    """Stores of this daemon's entries, by entry (``record``, ``manifest``): done, failed, and of
    the failures those the DHT answered but refused (the rest: no answer in time, a dead node)."""

    stored: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)


class Publisher:
    """Stores one entry of this peer (``what``) under ``key``, signed by ``signer``."""

    def __init__(self, membership: DhtMembership, *, what: str, key: str, signer: Identity, heartbeat_s: float,
                 store_log: StoreLog) -> None:
        self._membership = membership
        self.what = what
        self._key = key
        self._signer = signer
        self._heartbeat_s = heartbeat_s
        self._log = store_log
        self.failing = 0  # consecutive failed stores

    @property
    def retry_delay_s(self) -> float:
        """How long to wait before the next store: a heartbeat, or a quarter of one while failing."""
        return self._heartbeat_s * (RETRY_HEARTBEATS if self.failing else 1.0)

    async def publish(self, value: bytes, *, expiration_time: float) -> bool:
        """Store ``value``; True if a DHT node took it. A failure raises the alarm, never an error."""
        try:
            stored = await self._membership.store(self._key, value, signer=self._signer,
                                                  expiration_time=expiration_time)
            cause = "no DHT node accepted it (an entry with a later expiration holds its subkey, or it was refused)"
            if not stored:
                self._log.refused[self.what] += 1
        except TransportError as exc:
            stored, cause = False, str(exc)
        if stored:
            self._log.stored[self.what] += 1
            if self.failing:
                log.info("stored the %s in the DHT again after %d failed attempt(s)", self.what, self.failing)
            self.failing = 0
            return True
        self._log.failed[self.what] += 1
        self.failing += 1
        if self.failing == 1:
            log.warning("could not store the %s in the DHT: %s; retrying every %.1f s", self.what, cause,
                        self.retry_delay_s)
        return False

    async def withdraw(self, *, expiration_time: float) -> bool:
        """Hide the entry with a signed tombstone (expiring after the entry does); False if refused."""
        try:
            return await self._membership.withdraw(self._key, signer=self._signer, expiration_time=expiration_time)
        except TransportError as exc:
            log.warning("could not withdraw the %s (it expires by itself): %s", self.what, exc)
            return False
