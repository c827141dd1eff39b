"""Tenure: which peers may steer a peer's choices. Those whose work it used lately (first-hand: no
record can claim it), the tenured ones among them; else those it has seen live for the run's
tenure and those the run owner vouches for; only when none is tenured does every live candidate
count. So free identities, new or merely present for long, never move the choices of a peer that
sees contributors or tenured peers."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from gossamer.peer.run.manifest import TENURE_HEARTBEATS, RunConfig
from gossamer.peer.run.records import MAX_TENURED, TENURED_ID_HEX, PeerRecord
from gossamer.peer.run.view import LivePeer

DEFAULT_TENURE_S = TENURE_HEARTBEATS * RunConfig.heartbeat_s
"""A run's tenure unless its manifest says otherwise (12 heartbeats of 5 s: one minute)."""


def tenured_ids(live: Iterable[LivePeer], *, now: float, tenure_s: float) -> tuple[str, ...]:
    """What the run owner vouches for: the id prefixes of the peers live for ``tenure_s`` or more,
    the longest-present first, at most ``MAX_TENURED``."""
    senior = sorted((p for p in live if now - p.since >= tenure_s), key=lambda p: (p.since, p.record.peer_id))
    return tuple(p.record.peer_id[:TENURED_ID_HEX] for p in senior[:MAX_TENURED])


def is_tenured(peer: LivePeer, *, now: float, tenure_s: float, vouched: frozenset[str]) -> bool:
    return now - peer.since >= tenure_s or peer.record.peer_id[:TENURED_ID_HEX] in vouched


def seniors(candidates: Sequence[LivePeer], *, tenure_s: float = DEFAULT_TENURE_S,
            vouched: Collection[str] = ()) -> list[LivePeer]:
    """The candidates seen live without a break for ``tenure_s`` up to their last sighting, or whose
    id prefix is in ``vouched``; all of them when none is (for callers that know no clock: the
    view's own times alone decide, ``last_seen - since``)."""
    senior = [p for p in candidates
              if p.last_seen - p.since >= tenure_s or p.record.peer_id[:TENURED_ID_HEX] in vouched]
    return senior if senior else list(candidates)


def steering(candidates: Sequence[LivePeer], *, now: float, tenure_s: float, owner: PeerRecord | None,
             contributed: Collection[str] = ()) -> list[LivePeer]:
    """The candidates that may steer a choice: those in ``contributed`` (peer ids whose work this
    peer used lately), the tenured ones among them if any; when none of them is a candidate, the
    tenured ones; when none is, all."""
    vouched = frozenset(owner.tenured) if owner is not None else frozenset()
    workers = [p for p in candidates if p.record.peer_id in contributed] if contributed else []
    pool = workers or list(candidates)
    tenured = [p for p in pool if is_tenured(p, now=now, tenure_s=tenure_s, vouched=vouched)]
    return tenured if tenured else pool
