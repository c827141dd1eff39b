"""Choosing donors for a joining peer (the highest version on offer, at it the digest most donors
advertise, so every joiner decides alike) and downloading the run's state from exactly those
donors, verified against that digest (README.md of peer, "kit.state_join")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from gossamer.peer.kit.statesync import Donor, DownloadProgress, StateFetchReport, StateSyncError, fetch_state
from gossamer.peer.run.view import LivePeer
from gossamer.transport.http_client import HttpClient


def choose_donors(live: list[LivePeer], *, exclude: str = "") -> tuple[int, str, list[Donor]]:
    """(version, digest, donors) to download from; StateSyncError when nobody offers state. A
    private peer that no relay reaches is never a donor (``PeerRecord.reachable``)."""
    offers = [(p.record.state.get("version"), p.record.state.get("digest"), p.record) for p in live
              if p.record.peer_id != exclude and p.record.http_addr and p.record.reachable]
    offers = [(v, d, r) for v, d, r in offers if isinstance(v, int) and isinstance(d, str) and len(d) == 64]
    if not offers:
        raise StateSyncError("no live peer offers the run's state to download", failures=())
    version = max(v for v, _, _ in offers)
    votes = Counter(d for v, d, _ in offers if v == version)
    digest = min(votes, key=lambda d: (-votes[d], d))
    donors = [Donor(peer_id=r.peer_id, http_addr=r.http_addr) for v, d, r in offers if (v, d) == (version, digest)]
    return version, digest, sorted(donors, key=lambda donor: donor.peer_id)


async def download_state(client: HttpClient, live: list[LivePeer], *, joiner_id: str, timeout_s: float = 120.0,
                         progress: Callable[[DownloadProgress], None] | None = None,
                         ) -> tuple[int, dict[str, torch.Tensor], StateFetchReport]:
    """Download and verify the current state from the live donors; returns (version, tensors, report).
    ``progress`` hears how far the download is (``statesync.fetch_state``)."""
    version, digest, donors = choose_donors(live, exclude=joiner_id)
    tensors, report = await fetch_state(client, donors, version=version, digest=digest, joiner_id=joiner_id,
                                        timeout_s=timeout_s, progress=progress)
    return version, tensors, report
