"""Which peer holds which experts, computed alike by every peer from the sorted peer ids, E, r, the
round and the seed: ``place_experts`` (balanced, r holders each), ``replace_experts`` (moves
little when peers leave or join; ``lost`` names experts with no live holder), ``transfers``,
``from_assignments`` (back from published resident sets) and ``coverage``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from gossamer.protocols.core.errors import InvalidSetting


@dataclass(frozen=True)
class Placement:
    """Holders of every expert in one placement (peer ids sorted throughout)."""

    peers: tuple[str, ...]
    """The live peers this placement was computed for."""
    holders: tuple[tuple[str, ...], ...]
    """holders[e]: the peers that hold expert e."""
    replication: int
    """The run's target r (each expert has min(r, len(peers)) holders)."""
    round: int
    """The round it was computed at."""
    lost: tuple[int, ...] = ()
    """Experts none of whose holders in the previous placement was live (re-placement only)."""

    @property
    def n_experts(self) -> int:
        return len(self.holders)

    def resident(self, peer: str) -> tuple[int, ...]:
        """The experts ``peer`` holds (empty for a peer outside the placement)."""
        return tuple(e for e, holders in enumerate(self.holders) if peer in holders)

    def replications(self) -> tuple[int, ...]:
        """r_e: holders of each expert."""
        return tuple(len(h) for h in self.holders)

    def loads(self) -> dict[str, int]:
        """Experts held per peer."""
        return {peer: len(self.resident(peer)) for peer in self.peers}


@dataclass(frozen=True)
class Transfer:
    """Expert ``expert`` is new on ``peer``: fetch it from one of ``sources`` (empty when lost)."""

    peer: str
    expert: int
    sources: tuple[str, ...]


def _priority(seed: int, round: int, expert: int, peer: str) -> bytes:
    return hashlib.sha256(f"fomoe-placement:{seed}:{round}:{expert}:{peer}".encode()).digest()


def _check_peers(peer_ids: Iterable[str]) -> tuple[str, ...]:
    peers = tuple(peer_ids)
    bad = [p for p in peers if not isinstance(p, str) or not p]
    if bad:
        raise InvalidSetting(f"peer_ids: must be non-empty strings, got {bad!r}")
    if not peers:
        raise InvalidSetting("peer_ids: no live peer to place experts on")
    if len(set(peers)) != len(peers):
        raise InvalidSetting(f"peer_ids: duplicates in {sorted(peers)}")
    return tuple(sorted(peers))


def _check_ints(**values: object) -> None:
    for name, value in values.items():
        low = 0 if name in ("round", "seed") else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidSetting(f"{name}: must be an integer >= {low}, got {value!r}")


def place_experts(peer_ids: Iterable[str], *, n_experts: int, replication: int, round: int,
                  seed: int = 0) -> Placement:
    """A balanced placement of ``n_experts`` experts on the peers, each held by r of them."""
    _check_ints(n_experts=n_experts, replication=replication, round=round, seed=seed)
    peers = _check_peers(peer_ids)
    holders: list[set[str]] = [set() for _ in range(n_experts)]
    _fill(holders, peers, min(replication, len(peers)), seed=seed, round=round)
    return _placement(peers, holders, replication, round)


def replace_experts(previous: Placement, live_peer_ids: Iterable[str], *, round: int, seed: int = 0) -> Placement:
    """The placement after peers left or joined, moving as few experts as balance allows."""
    _check_ints(round=round, seed=seed)
    peers = _check_peers(live_peer_ids)
    live = set(peers)
    holders = [set(h) & live for h in previous.holders]
    lost = tuple(e for e, h in enumerate(holders) if not h)
    _fill(holders, peers, min(previous.replication, len(peers)), seed=seed, round=round)
    _rebalance(holders, peers, seed=seed, round=round)
    return _placement(peers, holders, previous.replication, round, lost)


def transfers(previous: Placement, new: Placement) -> list[Transfer]:
    """Every (peer, expert) that ``new`` adds, with the live holders it can be fetched from."""
    live = set(new.peers)
    out = []
    for expert, holders in enumerate(new.holders):
        sources = tuple(p for p in previous.holders[expert] if p in live) if expert < previous.n_experts else ()
        before = set(previous.holders[expert]) if expert < previous.n_experts else set()
        out.extend(Transfer(peer, expert, sources) for peer in holders if peer not in before)
    return out


def _loads(holders: list[set[str]], peers: tuple[str, ...]) -> dict[str, int]:
    loads = dict.fromkeys(peers, 0)
    for h in holders:
        for peer in h:
            loads[peer] += 1
    return loads


def _fill(holders: list[set[str]], peers: tuple[str, ...], r: int, *, seed: int, round: int) -> None:
    """Give every expert with fewer than r holders the least-loaded peers that lack it (experts
    with the fewest holders first)."""
    loads = _loads(holders, peers)
    for expert in sorted(range(len(holders)), key=lambda e: (len(holders[e]), e)):
        while len(holders[expert]) < r:
            peer = min((p for p in peers if p not in holders[expert]),
                       key=lambda p, e=expert: (loads[p], _priority(seed, round, e, p)))
            holders[expert].add(peer)
            loads[peer] += 1


def _rebalance(holders: list[set[str]], peers: tuple[str, ...], *, seed: int, round: int) -> None:
    """Move experts from the most to the least loaded peer until loads differ by at most one.
    (The busiest peer holds more experts than the idlest, so it holds one the idlest lacks.)"""
    loads = _loads(holders, peers)
    while True:
        busiest = min(peers, key=lambda p: (-loads[p], p))
        idlest = min(peers, key=lambda p: (loads[p], p))
        if loads[busiest] - loads[idlest] <= 1:
            return
        expert = min((e for e, h in enumerate(holders) if busiest in h and idlest not in h),
                     key=lambda e: _priority(seed, round, e, idlest))
        holders[expert].remove(busiest)
        holders[expert].add(idlest)
        loads[busiest] -= 1
        loads[idlest] += 1


def _placement(peers: tuple[str, ...], holders: list[set[str]], replication: int, round: int,
               lost: tuple[int, ...] = ()) -> Placement:
    return Placement(peers, tuple(tuple(sorted(h)) for h in holders), replication, round, lost)



def from_assignments(assignments: Mapping[str, Collection[int]], *, n_experts: int, replication: int,
                     round: int) -> Placement:
    """The placement that peer id -> resident experts describes (no balance is enforced: it is
    what the peers say they hold; ``lost`` lists the experts nobody holds)."""
    _check_ints(n_experts=n_experts, replication=replication, round=round)
    peers = _check_peers(assignments)
    holders: list[set[str]] = [set() for _ in range(n_experts)]
    for peer in peers:
        experts = list(assignments[peer])
        bad = [e for e in experts if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < n_experts]
        if bad:
            raise InvalidSetting(f"assignments: peer {peer} claims experts {bad} outside 0..{n_experts - 1}")
        for expert in experts:
            holders[expert].add(peer)
    return _placement(peers, holders, replication, round, tuple(e for e, h in enumerate(holders) if not h))


@dataclass(frozen=True)
class ExpertCoverage:
    """One expert as ``gossamer status`` shows it."""

    expert: int
    holders: tuple[str, ...]
    lost: bool
    """No live peer had its last synced weights when the placement was made."""
    tokens: int
    """(token, expert) pairs its holders ran in the round the counts come from."""


def coverage(placement: Placement, tokens_by_expert: Collection[int] | None = None) -> tuple[ExpertCoverage, ...]:
    """Holders, lost flag and pairs run per expert (``tokens_by_expert``: one count per expert,
    e.g. the column sums of the round's ``FomoeUpdate.tokens``; None: zeros)."""
    counts = [0] * placement.n_experts if tokens_by_expert is None else [int(t) for t in tokens_by_expert]
    if len(counts) != placement.n_experts:
        raise InvalidSetting(f"tokens_by_expert: expected {placement.n_experts} counts, got {len(counts)}")
    return tuple(ExpertCoverage(e, holders, e in placement.lost, counts[e])
                 for e, holders in enumerate(placement.holders))
