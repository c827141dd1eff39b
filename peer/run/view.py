"""``PeerView``: the live peer table of one run, rebuilt from signed records found in the DHT. Pure
state: it verifies and admits every record, counts refusals by reason, bounds the signature checks
per read (known peers first) and remembers since when each peer is live (README.md of peer, "run.view")."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from gossamer.peer.errors import RecordRejected
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.records import PeerRecord, open_record

DEFAULT_MAX_VERIFY = 512


@dataclass(frozen=True)
class LivePeer:
    record: PeerRecord
    last_seen: float
    since: float = 0.0  # DHT time this table first saw the peer (continuously present since)
    blob: bytes = b""  # the signed record as found, so an unchanged one is not verified again


class PeerView:
    """Verified, admitted, unexpired peer records of one run, keyed by peer id."""

    def __init__(self, admission: Admission, *, ttl_s: float, max_verify: int = DEFAULT_MAX_VERIFY) -> None:
        self._admission = admission
        self._ttl_s = ttl_s
        self._max_verify = max_verify
        self._peers: dict[str, LivePeer] = {}
        self._random = random.Random()
        self.rejected: Counter[str] = Counter()
        self.last_rejections: dict[str, str] = {}
        self.deferred = 0  # records left unverified by the last read (over ``max_verify``)

    @property
    def admission(self) -> Admission:
        """The run's admission policy the view applies."""
        return self._admission

    def update(self, entries: dict[str, tuple[bytes, float]], *, now: float,
               withdrawn: Iterable[str] | None = None) -> None:
        """Rebuild the table from the records in ``entries`` that verify and are admitted.

        With ``withdrawn`` given (the subkeys the read found withdrawn), a peer whose record is
        missing from ``entries`` but has not expired and was not withdrawn stays: a DHT read comes
        back partial while a node holding some records does not answer (a frozen host), and the
        table would flap. A killed peer still leaves within the TTL; a clean exit at once. Without
        ``withdrawn`` (a one-off read) the table is exactly what ``entries`` holds (as far as
        ``max_verify`` allows).
        """
        gone = set(withdrawn) if withdrawn is not None else None
        fresh: dict[str, LivePeer] = {}
        if gone is not None:
            fresh = {peer_id: peer for peer_id, peer in self._peers.items()
                     if peer_id not in gone and now - peer.last_seen <= self._ttl_s}
        verified = self.deferred = 0
        for subkey in self._reading_order(entries):
            blob = entries[subkey][0]
            known = self._peers.get(subkey)
            if known is not None and known.blob == blob:
                record = known.record
            elif verified >= self._max_verify:
                self.deferred += 1
                continue
            else:
                verified += 1
                try:
                    record = open_record(blob, subkey=subkey, now=now, ttl_s=self._ttl_s)
                    self._admission.check(record, now=now)
                except RecordRejected as exc:
                    self._reject(subkey, exc)
                    continue
            if now - record.timestamp > self._ttl_s:
                continue
            kept = fresh.get(record.peer_id)
            if kept is None or kept.last_seen <= record.timestamp:
                since = known.since if known is not None else now
                fresh[record.peer_id] = LivePeer(record=record, last_seen=record.timestamp, since=since, blob=blob)
        self._peers = fresh

    def _reading_order(self, entries: dict[str, tuple[bytes, float]]) -> list[str]:
        """Known peers first, longest-present first; then new subkeys in random order."""
        known = sorted((s for s in entries if s in self._peers), key=lambda s: (self._peers[s].since, s))
        new = [s for s in entries if s not in self._peers]
        self._random.shuffle(new)
        return known + new

    def _reject(self, subkey: str, exc: RecordRejected) -> None:
        self.rejected[exc.reason] += 1
        self.last_rejections[subkey[:64]] = str(exc)
        while len(self.last_rejections) > 64:
            self.last_rejections.pop(next(iter(self.last_rejections)))

    def live(self, *, now: float) -> list[LivePeer]:
        """Peers whose record has not expired at ``now``, sorted by peer id."""
        return sorted((p for p in self._peers.values() if now - p.last_seen <= self._ttl_s),
                      key=lambda p: p.record.peer_id)

    def get(self, peer_id: str) -> LivePeer | None:
        return self._peers.get(peer_id)
