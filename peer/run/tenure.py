"""Tenure: which peers may steer a peer's choices. Those it has seen live for the run's tenure and
those the run owner vouches for; only when none is tenured does every live candidate count, so
free new identities never move the choices of a peer that sees tenured ones."""

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
