"""The live peer table of one run, rebuilt from signed records found in the DHT.

Pure state: the daemon feeds it what ``DhtMembership.get_all`` returned and the current DHT time;
it verifies every record, applies the run's admission policy, and remembers why records were
refused (counted per reason for ``/metrics``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from gossamer.peer.errors import RecordRejected
from gossamer.peer.run.admission import Admission
from gossamer.peer.run.records import PeerRecord, open_record


@dataclass(frozen=True)
class LivePeer:
    record: PeerRecord
    last_seen: float


class PeerView:
    """Verified, admitted, unexpired peer records of one run, keyed by peer id."""

    def __init__(self, admission: Admission, *, ttl_s: float) -> None:
        self._admission = admission
        self._ttl_s = ttl_s
        self._peers: dict[str, LivePeer] = {}
        self.rejected: Counter[str] = Counter()
        self.last_rejections: dict[str, str] = {}

    def update(self, entries: dict[str, tuple[bytes, float]], *, now: float,
               withdrawn: Iterable[str] | None = None) -> None:
        """Rebuild the table from the records in ``entries`` that verify and are admitted.

        With ``withdrawn`` given (the subkeys the read found withdrawn), a peer whose record is
        missing from ``entries`` but has not expired and was not withdrawn stays: a DHT read comes
        back partial while a node holding some records does not answer (a frozen host), and the
        table would flap. A killed peer still leaves within the TTL; a clean exit at once. Without
        ``withdrawn`` (a one-off read) the table is exactly what ``entries`` holds.
        """
        gone = set(withdrawn) if withdrawn is not None else None
        fresh: dict[str, LivePeer] = {}
        if gone is not None:
            fresh = {peer_id: peer for peer_id, peer in self._peers.items()
                     if peer_id not in gone and now - peer.last_seen <= self._ttl_s}
        for subkey, (blob, _expiration) in entries.items():
            try:
                record = open_record(blob, subkey=subkey, now=now, ttl_s=self._ttl_s)
                self._admission.check(record, now=now)
            except RecordRejected as exc:
                self._reject(subkey, exc)
                continue
            known = fresh.get(record.peer_id)
            if known is None or known.last_seen <= record.timestamp:
                fresh[record.peer_id] = LivePeer(record=record, last_seen=record.timestamp)
        self._peers = fresh

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
