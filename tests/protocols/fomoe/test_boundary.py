"""The end of a round, pure: commits as they travel (and every malformed one refused with the
reason), the agreement every member computes alike from the same commits (a drifted copy, a
partly delivered update, a minority, two hosts dying at once), the next placement and its
transfers (a lost expert from the freshest copy), and a joiner's admission."""

from __future__ import annotations

import itertools
import json

import pytest

from gossamer.protocols.fomoe.core import place_experts
from gossamer.protocols.fomoe.core.boundary import Commit, admit, agree, plan_boundary
from gossamer.protocols.fomoe.wire import ExpertMessageRefused

A, B, C, D, J = (c * 64 for c in "abcdf")
PEERS = (A, B, C, D)
E, R, SEED = 4, 2, 7
PLACEMENT = place_experts(PEERS, n_experts=E, replication=R, round=0, seed=SEED)
DENSE = "d" * 16


def commit(peer: str, *, arrived=PEERS, joiners=(), dense=DENSE, synced=(0,) * E, expert_digest="e" * 16) -> Commit:
    resident = PLACEMENT.resident(peer)
    return Commit(PEERS, tuple(sorted(arrived)), tuple(joiners), resident, tuple(synced), dense,
                  tuple(expert_digest for _ in resident))


def all_commits(**per_peer) -> dict[str, Commit]:
    return {p: per_peer.get(p) or commit(p) for p in PEERS}


def test_a_commit_travels_as_metadata_and_back() -> None:
    sent = commit(A, joiners=(J,), synced=(3, 1, 0, 2))
    assert Commit.from_metadata(sent.to_metadata(), n_experts=E) == sent


@pytest.mark.parametrize(("edit", "reason"), [
    (lambda body: body.pop("synced"), "expected the keys"),
    (lambda body: body.update(arrived=[J]), "arrived lists peers that are not members"),
    (lambda body: body.update(members=["not a peer id"]), "members must be a list of peer ids"),
    (lambda body: body.update(members=[A, A]), "lists a peer twice"),
    (lambda body: body.update(resident=[E]), "resident must be a list of integers"),
    (lambda body: body.update(resident=list(reversed(body["resident"]))), "resident sorted"),
    (lambda body: body.update(synced=[0] * (E - 1)), f"synced must have {E} entries"),
    (lambda body: body.update(dense_digest="xyz"), "one dense digest"),
    (lambda body: body.update(expert_digests=[]), "one digest per resident expert"),
    (lambda body: body.update(synced=[True] * E), "synced must be a list of integers"),
])
def test_a_malformed_commit_is_refused_with_the_reason(edit, reason: str) -> None:
    body = json.loads(commit(A).to_metadata()["commit"])
    edit(body)
    with pytest.raises(ExpertMessageRefused, match=reason):
        Commit.from_metadata({"commit": json.dumps(body)}, n_experts=E)


@pytest.mark.parametrize("metadata", [{}, {"commit": "{not json"}, {"commit": "x" * (1 << 17)}])
def test_a_commit_that_is_missing_not_json_or_too_long_is_refused(metadata: dict) -> None:
    with pytest.raises(ExpertMessageRefused, match="commit: "):
        Commit.from_metadata(metadata, n_experts=E)


def test_when_every_update_arrived_everyone_is_agreed_and_nothing_moves() -> None:
    outcome = agree(A, PLACEMENT, all_commits())
    assert outcome.agreed == PEERS and outcome.members == PEERS and not outcome.cut_off
    boundary = plan_boundary(PLACEMENT, outcome, all_commits(), round=1, seed=SEED)
    assert not boundary.changed and boundary.placement == PLACEMENT and boundary.transfers == ()


def test_an_update_that_reached_only_some_members_leaves_its_sender_out_on_every_member() -> None:
    """C's update reached A only: B and D lack it, so C (in two gaps) is dropped by everyone."""
    commits = all_commits(**{B: commit(B, arrived=(A, B, D)), D: commit(D, arrived=(A, B, D))})
    outcomes = {peer: agree(peer, PLACEMENT, commits) for peer in PEERS}
    assert {o.agreed for o in outcomes.values()} == {(A, B, D)}
    assert outcomes[C].cut_off and not any(outcomes[p].cut_off for p in (A, B, D))


def test_a_member_whose_copy_drifted_is_left_out() -> None:
    outcome = agree(A, PLACEMENT, all_commits(**{B: commit(B, dense="0" * 16)}))
    assert outcome.agreed == (A, C, D)
    # an expert's holders disagree one to one (r = 2): the tie goes to the smaller digest
    outcome = agree(A, PLACEMENT, all_commits(**{D: commit(D, expert_digest="f" * 16)}))
    assert outcome.agreed == (A, B, C)
    outcome = agree(A, PLACEMENT, all_commits(**{D: commit(D, expert_digest="0" * 16)}))
    others = {h for e in PLACEMENT.resident(D) for h in PLACEMENT.holders[e] if h != D}
    assert outcome.agreed == tuple(sorted(set(PEERS) - others))


def test_a_minority_is_cut_off() -> None:
    """A missed every other update and the others missed A's: A is alone, so it is cut off."""
    commits = all_commits(**{A: commit(A, arrived=(A,))})
    commits.update({p: commit(p, arrived=tuple(q for q in PEERS if q != A)) for p in (B, C, D)})
    assert agree(A, PLACEMENT, commits).cut_off
    assert agree(B, PLACEMENT, commits).agreed == (B, C, D)


def test_a_member_that_left_is_re_placed_from_the_agreed_holders_and_every_expert_keeps_r_holders() -> None:
    commits = {p: commit(p, arrived=(A, B, C)) for p in (A, B, C)}  # D died: no commit, no update
    outcome = agree(A, PLACEMENT, commits)
    assert outcome.agreed == (A, B, C)
    boundary = plan_boundary(PLACEMENT, outcome, commits, round=1, seed=SEED)
    assert boundary.changed and boundary.lost == () and boundary.placement.peers == (A, B, C)
    assert all(len(h) == R for h in boundary.placement.holders)
    for move in boundary.transfers:  # each new holder takes the expert from its agreed holders
        assert move.sources and set(move.sources) <= {h for h in PLACEMENT.holders[move.expert] if h != D}
    assert {(m.peer, m.expert) for m in boundary.transfers} == {
        (p, e) for e, holders in enumerate(boundary.placement.holders) for p in holders
        if p not in PLACEMENT.holders[e]}


def test_two_of_four_dying_at_once_leave_the_two_others_agreed_whatever_their_ids() -> None:
    for dead in itertools.combinations(PEERS, 2):
        left = tuple(p for p in PEERS if p not in dead)
        commits = {p: commit(p, arrived=left) for p in left}
        outcomes = [agree(p, PLACEMENT, commits) for p in left]
        assert all(o.agreed == left and not o.cut_off for o in outcomes), dead


def test_an_expert_whose_holders_all_left_is_lost_and_restarts_from_the_freshest_copy() -> None:
    expert = 0
    gone = set(PLACEMENT.holders[expert])
    left = tuple(p for p in PEERS if p not in gone)
    fresh = left[-1]
    commits = {p: commit(p, arrived=left, synced=(2 if p == fresh else 1,) + (0,) * (E - 1)) for p in left}
    outcome = agree(left[0], PLACEMENT, commits)
    assert outcome.agreed == left and not outcome.cut_off  # half of the members is enough
    boundary = plan_boundary(PLACEMENT, outcome, commits, round=1, seed=SEED)
    assert expert in boundary.lost
    moves = [m for m in boundary.transfers if m.expert == expert]
    assert moves and all(m.sources == (fresh,) for m in moves)
    assert set(boundary.placement.holders[expert]) == {m.peer for m in moves} | (
        {fresh} & set(boundary.placement.holders[expert]))


def test_a_joiner_computes_what_the_members_compute() -> None:
    commits = {p: commit(p, joiners=(J,)) for p in PEERS}
    admitted = admit(J, commits, n_experts=E, replication=R, round=0, seed=SEED)
    assert not isinstance(admitted, str)
    outcome, boundary = admitted
    members_view = plan_boundary(PLACEMENT, agree(A, PLACEMENT, commits), commits, round=1, seed=SEED)
    assert outcome.members == tuple(sorted((*PEERS, J))) and boundary == members_view
    assert len(boundary.placement.resident(J)) > 0


@pytest.mark.parametrize(("drop", "reason"), [
    ("commit", "no commit from 1 of 4 members"), ("listing", "not every member heard the request to join")])
def test_a_joiner_is_not_admitted_without_every_members_commit_listing_it(drop: str, reason: str) -> None:
    commits = {p: commit(p, joiners=(J,)) for p in PEERS}
    if drop == "commit":
        del commits[D]
    else:
        commits[D] = commit(D)
    assert admit(J, commits, n_experts=E, replication=R, round=0, seed=SEED) == reason


def test_the_outcome_does_not_depend_on_the_order_commits_arrived_in() -> None:
    commits = all_commits(**{B: commit(B, arrived=(A, B, D)), C: commit(C, joiners=(J,))})
    outcomes = {agree(A, PLACEMENT, dict(order)) for order in itertools.permutations(commits.items())}
    assert len(outcomes) == 1
