"""The end of a round, pure: each member's ``Commit`` (checked as received), ``agree`` (which
members' updates count, who joins, who is cut off: the same on every peer that saw the same
commits), ``plan_boundary`` (the next placement and its expert transfers) and ``admit`` (a
joiner's view of the same). The rules: ``protocols/fomoe/README.md``, "A round, step by step".
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gossamer.protocols.fomoe.core import Placement, Transfer, from_assignments, replace_experts, transfers
from gossamer.protocols.fomoe.core.errors import ExpertMessageRefused

_PEER_ID = re.compile(r"[0-9a-f]{64}")
COMMIT_KEY = "commit"
MAX_COMMIT_CHARS = 1 << 16


@dataclass(frozen=True)
class Commit:
    """What one member says at the end of a round: the members as it knows them, whose update it
    holds (itself included), who asked it to join, the experts it held, how fresh each copy is,
    and digests of its dense part and of each expert at the round's start."""

    members: tuple[str, ...]
    arrived: tuple[str, ...]
    joiners: tuple[str, ...]
    resident: tuple[int, ...]
    synced: tuple[int, ...]
    """Per expert: the round at whose start the sender's copy was last its holders' copy."""
    dense_digest: str = ""
    """Digest of the sender's dense parameters at the round's start."""
    expert_digests: tuple[str, ...] = ()
    """Digest of each resident expert's parameters at the round's start, in ``resident``'s order."""

    def to_metadata(self) -> dict[str, str]:
        body = {"members": list(self.members), "arrived": list(self.arrived), "joiners": list(self.joiners),
                "resident": list(self.resident), "synced": list(self.synced), "dense_digest": self.dense_digest,
                "expert_digests": list(self.expert_digests)}
        return {COMMIT_KEY: json.dumps(body, separators=(",", ":"))}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str], *, n_experts: int) -> Commit:
        """A commit as received; ``ExpertMessageRefused`` says what is wrong with it."""
        text = metadata.get(COMMIT_KEY)
        if not isinstance(text, str) or len(text) > MAX_COMMIT_CHARS:
            raise ExpertMessageRefused("commit: missing or too long")
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise ExpertMessageRefused(f"commit: not JSON ({exc})") from exc
        if not isinstance(body, dict) or set(body) != _COMMIT_KEYS:
            raise ExpertMessageRefused(f"commit: expected the keys {sorted(_COMMIT_KEYS)}")
        members = _peer_ids(body["members"], "members")
        arrived = _peer_ids(body["arrived"], "arrived")
        if not set(arrived) <= set(members):
            raise ExpertMessageRefused("commit: arrived lists peers that are not members")
        resident = _ints(body["resident"], "resident", low=0, high=n_experts - 1)
        synced = _ints(body["synced"], "synced", low=0, high=1 << 62)
        if len(synced) != n_experts or len(set(resident)) != len(resident) or list(resident) != sorted(resident):
            raise ExpertMessageRefused(f"commit: synced must have {n_experts} entries, resident sorted, no repeats")
        digests = body["expert_digests"]
        if not _is_digest(body["dense_digest"]) or not isinstance(digests, list) or \
                len(digests) != len(resident) or not all(_is_digest(d) for d in digests):
            raise ExpertMessageRefused("commit: one dense digest and one digest per resident expert expected")
        return cls(members, arrived, _peer_ids(body["joiners"], "joiners"), resident, synced, body["dense_digest"],
                   tuple(digests))

    def expert_digest(self, expert: int) -> str:
        return self.expert_digests[self.resident.index(expert)]


_COMMIT_KEYS = frozenset({"members", "arrived", "joiners", "resident", "synced", "dense_digest", "expert_digests"})
_DIGEST = re.compile(r"[0-9a-f]{16,64}")


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and bool(_DIGEST.fullmatch(value))


def _peer_ids(value: object, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and _PEER_ID.fullmatch(p) for p in value):
        raise ExpertMessageRefused(f"commit: {name} must be a list of peer ids")
    if len(set(value)) != len(value):
        raise ExpertMessageRefused(f"commit: {name} lists a peer twice")
    return tuple(sorted(value))


def _ints(value: object, name: str, *, low: int, high: int) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in value):
        raise ExpertMessageRefused(f"commit: {name} must be a list of integers in [{low}, {high}]")
    return tuple(value)


@dataclass(frozen=True)
class Outcome:
    """What a round's commits decide (the same on every peer that saw the same commits)."""

    agreed: tuple[str, ...]
    joiners: tuple[str, ...]
    members: tuple[str, ...]
    """Next round's members: agreed + joiners."""
    cut_off: bool
    counted: tuple[str, ...]
    """The senders whose commits were taken into account (this peer's own included)."""


def agree(me: str, placement: Placement, commits: Mapping[str, Commit]) -> Outcome:
    """The outcome of a round from ``commits`` by sender (``me``'s own among them).

    First every member whose commit shows a dense digest, or a digest of one of its experts, that
    is not the one most of that part's commits show is dropped (its copy drifted). Then agreed is
    the largest set this greedy rule finds in which every member holds every other's update: start
    from the members left (one whose commit is missing is taken to hold everything: if it is
    alive it decides for itself, if it is dead it no longer matters), and while some member lacks
    another's update, drop one of the members involved in such gaps: first one whose commit is
    missing (it most likely died: two of four hosts dying at once must not cut off the two that
    are left), else the one in most gaps, ties: the higher peer id. A member whose inbox failed is
    dropped alone; so is one whose update reached nobody."""
    counted = tuple(sorted(sender for sender, commit in commits.items()
                           if sender in placement.peers and commit.members == placement.peers
                           and commit.resident == placement.resident(sender)))
    holds = {p: set(commits[p].arrived) if p in counted else set(placement.peers) for p in placement.peers}
    agreed = set(placement.peers) - _drifted(placement, {p: commits[p] for p in counted})
    while gaps := [(i, k) for i in agreed for k in agreed if k not in holds[i]]:
        blame = Counter(p for gap in gaps for p in gap)
        agreed.discard(max(blame, key=lambda p: (p not in counted, blame[p], p)))
    voters = [p for p in counted if p in agreed]
    joiners = set.intersection(*(set(commits[p].joiners) for p in voters)) if voters else set()
    joining = joiners - agreed
    cut_off = me not in agreed or 2 * len(agreed) < len(placement.peers)
    return Outcome(tuple(sorted(agreed)), tuple(sorted(joining)), tuple(sorted(agreed | joining)), cut_off, counted)


def _drifted(placement: Placement, commits: Mapping[str, Commit]) -> set[str]:
    """Senders whose dense or expert digest is not the one most commits show for that part."""
    parts = [{p: c.dense_digest for p, c in commits.items()}]
    parts += [{p: commits[p].expert_digest(e) for p in holders if p in commits} for e, holders in
              enumerate(placement.holders)]
    drifted = set()
    for digests in parts:
        if digests:
            votes = Counter(digests.values())
            common = min(votes, key=lambda d: (-votes[d], d))
            drifted |= {p for p, d in digests.items() if d != common}
    return drifted


@dataclass(frozen=True)
class Boundary:
    """The placement of the next round and the expert transfers that lead to it."""

    placement: Placement
    transfers: tuple[Transfer, ...]
    """(new holder, expert, the peers it takes the expert's state from: one of them for a lost expert)."""
    lost: tuple[int, ...]
    """Experts none of whose holders is an agreed member."""
    changed: bool

    def incoming(self, peer: str) -> list[Transfer]:
        """What ``peer`` receives (a transfer whose only source is ``peer`` itself needs no message)."""
        return [t for t in self.transfers if t.peer == peer and t.sources != (peer,)]

    def outgoing(self, peer: str) -> list[Transfer]:
        """What ``peer`` sends: every transfer it is a source of (to another peer)."""
        return [t for t in self.transfers if peer in t.sources and t.peer != peer]


def plan_boundary(placement: Placement, outcome: Outcome, commits: Mapping[str, Commit], *, round: int,
                  seed: int) -> Boundary:
    """The placement for ``round`` after ``outcome``: unchanged when the members are, otherwise
    ``replace_experts`` from the agreed members' holdings, with the transfers that lead to it;
    ``commits`` give each agreed member's freshness for the lost experts."""
    if outcome.members == placement.peers:
        return Boundary(placement, (), (), False)
    held = from_assignments({p: placement.resident(p) for p in outcome.agreed}, n_experts=placement.n_experts,
                            replication=placement.replication, round=placement.round)
    new = replace_experts(held, outcome.members, round=round, seed=seed)
    lost = tuple(e for e, holders in enumerate(held.holders) if not holders)
    moves = [_with_source(t, outcome.agreed, commits) if not t.sources else t for t in transfers(held, new)]
    return Boundary(new, tuple(moves), lost, True)


def _with_source(transfer: Transfer, agreed: Sequence[str], commits: Mapping[str, Commit]) -> Transfer:
    """A lost expert's transfer from the agreed member with the freshest copy (ties: lowest id)."""
    known = [p for p in sorted(agreed) if p in commits]
    source = max(known, key=lambda p: (commits[p].synced[transfer.expert], -known.index(p)), default=transfer.peer)
    return Transfer(transfer.peer, transfer.expert, (source,))


def admit(me: str, commits: Mapping[str, Commit], *, n_experts: int, replication: int, round: int,
          seed: int) -> tuple[Outcome, Boundary] | str:
    """A joiner's view of round ``round``'s end from the commits it was sent: the outcome and the
    next placement, exactly as the members compute them; or why it is not admitted (it must have
    a commit from every member, each listing it as a joiner)."""
    lists = {commit.members for commit in commits.values()}
    if len(lists) != 1:
        return "no commit arrived" if not lists else "the commits disagree on who the members are"
    (members,) = lists
    missing = sorted(set(members) - set(commits))
    if missing:
        return f"no commit from {len(missing)} of {len(members)} members"
    if any(me not in commits[m].joiners for m in members):
        return "not every member heard the request to join"
    placement = from_assignments({m: commits[m].resident for m in members}, n_experts=n_experts,
                                 replication=replication, round=round)
    own = {m: commits[m] for m in members}
    outcome = agree(me, placement, own)
    if me not in outcome.members or not outcome.agreed:
        return "the members did not agree to take it"
    return outcome, plan_boundary(placement, outcome, own, round=round + 1, seed=seed)
