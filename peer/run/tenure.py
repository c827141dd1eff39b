"""Tenure: how long a peer has been in the run, and which peers may steer a peer's choices.

Identities are free in an open run, so a choice that follows "the peers" (the median round a
DiLoCo learner keeps in step with, the state a joiner adopts, which senders an inbox keeps room
for) would follow whoever spawns the most of them. Such choices follow the **tenured** peers:

- those this peer has seen live without a break for at least the run's tenure
  (``Manifest.tenure_s``: twelve heartbeats; ``LivePeer.since``), and
- those the run owner vouches for: the owner's signed record lists (``PeerRecord.tenured``) the
  peers it has seen live that long. A joiner has seen nobody for long; this is what it relies on.

Only when none of the candidates is tenured (the first minutes of a run, or of a role nobody has
held for long) does every live candidate count.

What it promises: identities younger than the tenure, however many, do not move the choices of a
peer that can see tenured ones. What it does not: an identity that stays live for the tenure
counts like any other (SECURITY.md, "open runs").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gossamer.peer.run.records import MAX_TENURED, TENURED_ID_HEX, PeerRecord
from gossamer.peer.run.view import LivePeer


def tenured_ids(live: Iterable[LivePeer], *, now: float, tenure_s: float) -> tuple[str, ...]:
    """What the run owner vouches for: the id prefixes of the peers live for ``tenure_s`` or more,
    the longest-present first, at most ``MAX_TENURED``."""
    senior = sorted((p for p in live if now - p.since >= tenure_s), key=lambda p: (p.since, p.record.peer_id))
    return tuple(p.record.peer_id[:TENURED_ID_HEX] for p in senior[:MAX_TENURED])


def is_tenured(peer: LivePeer, *, now: float, tenure_s: float, vouched: frozenset[str]) -> bool:
    return now - peer.since >= tenure_s or peer.record.peer_id[:TENURED_ID_HEX] in vouched


def steering(candidates: Sequence[LivePeer], *, now: float, tenure_s: float,
             owner: PeerRecord | None) -> list[LivePeer]:
    """The candidates that may steer a choice: the tenured ones, or all when none is."""
    vouched = frozenset(owner.tenured) if owner is not None else frozenset()
    tenured = [p for p in candidates if is_tenured(p, now=now, tenure_s=tenure_s, vouched=vouched)]
    return tenured if tenured else list(candidates)
