"""Placement: balance and replication factor, identical on every peer (computed in separate
interpreters), and re-placement after peers leave or join."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.fomoe.core import (
    Placement,
    coverage,
    from_assignments,
    place_experts,
    replace_experts,
    transfers,
)


def peer_ids(n: int) -> list[str]:
    return [f"{(7919 * i + 13) % 65536:04x}peer{i}" for i in range(n)]


def assert_balanced(placement: Placement, r: int) -> None:
    w, e = len(placement.peers), placement.n_experts
    assert placement.replications() == (min(r, w),) * e
    assert all(len(set(h)) == len(h) and set(h) <= set(placement.peers) for h in placement.holders)
    loads = placement.loads()
    assert max(loads.values()) - min(loads.values()) <= 1
    assert sum(loads.values()) == e * min(r, w)


@settings(max_examples=200, deadline=None)
@given(w=st.integers(1, 12), e=st.integers(1, 20), r=st.integers(1, 14), round=st.integers(0, 1000))
def test_every_expert_has_r_distinct_holders_and_loads_differ_by_at_most_one(w: int, e: int, r: int,
                                                                             round: int) -> None:
    assert_balanced(place_experts(peer_ids(w), n_experts=e, replication=r, round=round), r)


def test_eight_experts_on_four_peers() -> None:
    for r, resident in ((1, 2), (2, 4), (4, 8)):
        placement = place_experts(peer_ids(4), n_experts=8, replication=r, round=0)
        assert set(placement.loads().values()) == {resident}
    full = place_experts(peer_ids(4), n_experts=8, replication=4, round=0)
    assert all(full.resident(p) == tuple(range(8)) for p in full.peers)


def test_order_of_the_ids_does_not_matter_but_round_and_seed_do() -> None:
    ids = peer_ids(6)
    base = place_experts(ids, n_experts=8, replication=2, round=5, seed=1)

    assert place_experts(list(reversed(ids)), n_experts=8, replication=2, round=5, seed=1) == base
    assert place_experts(ids, n_experts=8, replication=2, round=6, seed=1).holders != base.holders
    assert place_experts(ids, n_experts=8, replication=2, round=5, seed=2).holders != base.holders


PROGRAM = """
import json, sys
from gossamer.protocols.fomoe.core.placement import place_experts
ids = json.loads(sys.argv[1])
p = place_experts(ids, n_experts=8, replication=2, round=3, seed=9)
print(json.dumps({peer: p.resident(peer) for peer in ids}))
"""


def test_peers_compute_the_same_placement_independently() -> None:
    """Each "peer" is a fresh interpreter with its own hash seed and its own order of the ids."""
    ids = peer_ids(5)
    answers = []
    for hash_seed, order in (("1", ids), ("2", ids[::-1]), ("3", ids[2:] + ids[:2])):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", PROGRAM, json.dumps(order)], env=env, check=True,
                             capture_output=True, text=True, timeout=120).stdout
        answers.append(json.loads(out))

    assert answers[0] == answers[1] == answers[2]
    assert sorted(Counter(e for r in answers[0].values() for e in r).values()) == [2] * 8


def test_co_holders_vary_between_experts() -> None:
    placement = place_experts(peer_ids(4), n_experts=8, replication=2, round=0)
    assert len(set(placement.holders)) > 2  # not two fixed pairs of identical peers


@settings(max_examples=150, deadline=None)
@given(w=st.integers(2, 10), e=st.integers(1, 16), r=st.integers(1, 4), data=st.data())
def test_replacement_after_departures_keeps_survivors_and_restores_balance(w: int, e: int, r: int,
                                                                           data: st.DataObject) -> None:
    ids = peer_ids(w)
    before = place_experts(ids, n_experts=e, replication=r, round=0)
    gone = set(data.draw(st.lists(st.sampled_from(ids), max_size=w - 1, unique=True)))
    live = [p for p in ids if p not in gone]

    after = replace_experts(before, live, round=1)

    assert_balanced(after, r)
    assert after.lost == tuple(x for x in range(e) if set(before.holders[x]) <= gone)
    new = transfers(before, after)
    gained = sum(len(set(after.resident(p)) - set(before.resident(p))) for p in after.peers)
    assert len(new) == gained
    for t in new:
        assert t.expert not in before.resident(t.peer)
        assert set(t.sources) == set(before.holders[t.expert]) - gone
        assert (t.sources == ()) == (t.expert in after.lost)


def test_one_departure_moves_only_what_the_leaver_held() -> None:
    ids = peer_ids(4)
    before = place_experts(ids, n_experts=8, replication=2, round=0)
    leaver = ids[1]

    after = replace_experts(before, [p for p in ids if p != leaver], round=1)

    assert after.lost == ()
    for peer in after.peers:
        assert set(before.resident(peer)) <= set(after.resident(peer))
    new = transfers(before, after)
    assert sorted(t.expert for t in new) == sorted(before.resident(leaver))
    assert all(t.sources and leaver not in t.sources for t in new)


def test_experts_whose_holders_all_left_are_reported_lost_and_reassigned() -> None:
    ids = peer_ids(4)
    before = place_experts(ids, n_experts=8, replication=1, round=0)
    leaver = ids[0]

    after = replace_experts(before, ids[1:], round=1)

    assert after.lost == before.resident(leaver)
    assert_balanced(after, 1)
    assert [t.sources for t in transfers(before, after) if t.expert in after.lost] == [()] * len(after.lost)


def test_a_joiner_takes_experts_from_the_busiest_peers() -> None:
    ids = peer_ids(4)
    before = place_experts(ids[:3], n_experts=8, replication=2, round=0)

    after = replace_experts(before, ids, round=1)

    assert_balanced(after, 2)
    assert len(after.resident(ids[3])) == 4
    assert all(t.peer == ids[3] and t.sources for t in transfers(before, after))


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"peer_ids": []}, "peer_ids"), ({"peer_ids": ["a", "a"]}, "peer_ids"), ({"peer_ids": ["a", ""]}, "peer_ids"),
    ({"n_experts": 0}, "n_experts"), ({"replication": 0}, "replication"), ({"round": -1}, "round"),
])
def test_bad_arguments_are_refused_by_name(kwargs: dict, field: str) -> None:
    args = {"peer_ids": ["a", "b"], "n_experts": 4, "replication": 1, "round": 0, **kwargs}
    with pytest.raises(InvalidSetting, match=field):
        place_experts(args.pop("peer_ids"), **args)


def test_a_placement_reads_back_from_what_peers_publish() -> None:
    placement = place_experts(peer_ids(5), n_experts=8, replication=2, round=4)
    published = {peer: list(placement.resident(peer)) for peer in placement.peers}

    assert from_assignments(published, n_experts=8, replication=2, round=4) == placement
    short = from_assignments({p: r for p, r in published.items() if p != placement.peers[0]},
                             n_experts=8, replication=2, round=4)
    assert short.lost == tuple(e for e, h in enumerate(placement.holders) if h == (placement.peers[0],))
    with pytest.raises(InvalidSetting, match="outside"):
        from_assignments({"a": [8]}, n_experts=8, replication=1, round=0)


def test_coverage_lists_holders_lost_experts_and_tokens() -> None:
    before = place_experts(peer_ids(4), n_experts=8, replication=1, round=0)
    after = replace_experts(before, peer_ids(4)[1:], round=1)

    rows = coverage(after, list(range(10, 18)))

    assert [r.holders for r in rows] == list(after.holders)
    assert [r.expert for r in rows if r.lost] == list(after.lost) and after.lost
    assert [r.tokens for r in rows] == list(range(10, 18))
    with pytest.raises(InvalidSetting, match="tokens_by_expert"):
        coverage(after, [1, 2])
