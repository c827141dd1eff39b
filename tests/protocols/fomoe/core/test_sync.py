"""The FoMoE sync: holder-only averaging against the naive per-expert average, idle experts, the
robust aggregators, refused updates, and the byte formula against bytes counted from real tensors."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.core.errors import NotEnoughUpdates
from gossamer.protocols.core.robust import Contribution, Failure, build_aggregator
from gossamer.protocols.fomoe.core import (
    FomoeUpdate,
    PairLimits,
    ParamLayout,
    Placement,
    addressed_to,
    build_moe_model,
    clip_to_median_norm,
    expert_of,
    median_norm,
    mix_round,
    place_experts,
    plain_mean,
    robust_default,
    sync_bytes,
    token_weighted_mean,
    update_problem,
)
from tests.protocols.fomoe.core.conftest import TINY

PEERS = ["a1", "b2", "c3", "d4"]
LAYOUT = ParamLayout.of(build_moe_model(TINY, seed=0))


def synthetic_updates(placement: Placement, *, seed: int, zero: set[tuple[str, int, int]] = frozenset()
                      ) -> list[FomoeUpdate]:
    """Random deltas and pair counts; (peer, block, expert) in ``zero`` ran no pairs (zero delta)."""
    gen = torch.Generator().manual_seed(seed)
    updates = []
    for peer in placement.peers:
        resident = placement.resident(peer)
        tokens = torch.zeros(LAYOUT.n_layers, LAYOUT.n_experts, dtype=torch.int64)
        delta = {n: torch.randn(LAYOUT.shapes[n], generator=gen) for n in LAYOUT.dense}
        for block, expert in LAYOUT.units_of(resident):
            ran = 0 if (peer, block, expert) in zero else int(torch.randint(1, 50, (), generator=gen))
            tokens[block, expert] = ran
            for name in LAYOUT.units[(block, expert)]:
                delta[name] = torch.randn(LAYOUT.shapes[name], generator=gen) * (ran > 0)
        updates.append(FomoeUpdate(peer, delta, tokens))
    return updates


def naive_unit_average(updates: list[FomoeUpdate], placement: Placement, block: int, expert: int) -> dict:
    """sum_i t_i d_i / sum_i t_i over the holders of ``expert``, parameter by parameter."""
    holders = [u for u in updates if u.sender in placement.holders[expert] and int(u.tokens[block, expert]) > 0]
    total = sum(int(u.tokens[block, expert]) for u in holders)
    return {name: sum(int(u.tokens[block, expert]) * u.delta[name] for u in holders) / total
            for name in LAYOUT.units[(block, expert)]}


@pytest.mark.parametrize("replication", [1, 2, 3, 4])
def test_each_expert_is_the_token_weighted_average_over_its_holders_only(replication: int) -> None:
    placement = place_experts(PEERS, n_experts=4, replication=replication, round=0)
    updates = synthetic_updates(placement, seed=replication)

    mixed = mix_round(updates, placement, LAYOUT, dense_aggregator=plain_mean, expert_aggregator=token_weighted_mean)

    assert mixed.idle == () and mixed.rejected == ()
    for name in LAYOUT.dense:
        torch.testing.assert_close(mixed.dense[name], torch.stack([u.delta[name] for u in updates]).mean(0))
    for (block, expert), got in mixed.experts.items():
        want = naive_unit_average(updates, placement, block, expert)
        for name in want:
            torch.testing.assert_close(got[name], want[name])
        assert mixed.expert_results[(block, expert)].used == placement.holders[expert]


def test_a_peer_aggregates_only_the_experts_it_asks_for() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=2, round=0)
    mine = placement.resident("b2")

    mixed = mix_round(synthetic_updates(placement, seed=0), placement, LAYOUT, experts=mine)

    assert {e for _, e in mixed.experts} == set(mine)


def test_holders_that_ran_no_tokens_are_left_out_and_an_expert_nobody_used_is_idle() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=2, round=0)
    h0, h1 = placement.holders[0]
    zero = {(h0, 0, 0), (h1, 0, 0), (placement.holders[1][0], 1, 1)}
    updates = synthetic_updates(placement, seed=1, zero=zero)

    mixed = mix_round(updates, placement, LAYOUT)

    assert mixed.idle == ((0, 0),)
    result = mixed.expert_results[(1, 1)]
    assert result.used == (placement.holders[1][1],)
    assert [f.sender for f in result.rejected] == [placement.holders[1][0]]
    for name, value in naive_unit_average(updates, placement, 1, 1).items():
        torch.testing.assert_close(mixed.experts[(1, 1)][name], value)


def test_robust_aggregators_serve_the_dense_part_and_each_expert_among_its_holders() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=3, round=0)
    updates = synthetic_updates(placement, seed=2)
    attacker = updates[0]
    poisoned = FomoeUpdate(attacker.sender, {n: t + 1e3 for n, t in attacker.delta.items()}, attacker.tokens)
    honest = updates[1:]

    mixed = mix_round([poisoned, *honest], placement, LAYOUT,
                      dense_aggregator=build_aggregator("median", f=1),
                      expert_aggregator=build_aggregator("median", f=1))

    def within_honest_range(value: torch.Tensor, name: str, senders: tuple[str, ...]) -> bool:
        stacked = torch.stack([u.delta[name] for u in honest if u.sender in senders])
        return bool((value >= stacked.min(0).values).all() and (value <= stacked.max(0).values).all())

    assert all(within_honest_range(mixed.dense[name], name, placement.peers) for name in LAYOUT.dense)
    attacked = [e for e in range(4) if attacker.sender in placement.holders[e]]
    assert attacked
    for (block, expert), got in mixed.experts.items():
        for name in LAYOUT.units[(block, expert)]:
            assert within_honest_range(got[name], name, placement.holders[expert]), (block, expert, name)


def _norm(params: dict, names) -> float:
    return float(torch.cat([params[n].flatten() for n in names]).norm())


def test_the_default_rules_bound_a_sign_flipped_x20_holder_that_claims_many_pairs() -> None:
    """Issue 30's attack in one mix: the plain rules let it move the dense part and its experts by
    x20 its own update; the default ones no further than an honest update of the same round."""
    placement = place_experts(PEERS, n_experts=4, replication=2, round=0)
    updates = synthetic_updates(placement, seed=5)
    attacker, honest = updates[0], updates[1:]
    claims = attacker.tokens.clone()
    claims[:, list(placement.resident(attacker.sender))] = 10_000
    flipped = FomoeUpdate(attacker.sender, {n: -20 * t for n, t in attacker.delta.items()}, claims)

    plain = mix_round([flipped, *honest], placement, LAYOUT, dense_aggregator=plain_mean,
                      expert_aggregator=token_weighted_mean)
    robust = mix_round([flipped, *honest], placement, LAYOUT)

    honest_dense = max(_norm(u.delta, LAYOUT.dense) for u in honest)
    assert _norm(plain.dense, LAYOUT.dense) > 3 * honest_dense
    assert _norm(robust.dense, LAYOUT.dense) <= honest_dense * (1 + 1e-5)
    attacked = LAYOUT.units_of(placement.resident(attacker.sender))
    for key in attacked:
        names = LAYOUT.units[key]
        other = next(u for u in honest if u.sender in placement.holders[key[1]])
        assert _norm(plain.experts[key], names) > 10 * _norm(other.delta, names)
        assert _norm(robust.experts[key], names) <= _norm(other.delta, names) * (1 + 1e-5)
        assert robust.expert_results[key].used == tuple(sorted(placement.holders[key[1]]))


def test_clipping_scales_only_the_norms_above_the_lower_median_and_ignores_claimed_weights() -> None:
    vectors = [torch.tensor([3.0, 4.0]), torch.tensor([0.0, 1.0]), torch.tensor([60.0, -80.0])]
    contributions = [Contribution(f"p{i}", v, weight=10.0 ** i) for i, v in enumerate(vectors)]
    assert median_norm(contributions) == 5.0
    assert median_norm(contributions[:2]) == 1.0 and median_norm(contributions[:1]) is None

    result = clip_to_median_norm(plain_mean)(contributions, ())

    torch.testing.assert_close(result.value, (vectors[0] + vectors[1] + vectors[2] / 20) / 3)
    assert robust_default(contributions[:1], ()).value.equal(vectors[0])


def test_pair_counts_above_what_a_round_can_hold_are_refused_whole() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=3, round=0)
    limits = PairLimits.of(batch_size=2, context=4, inner_steps=3, top_k=2)
    assert (limits.per_unit, limits.per_block) == (24, 48)
    update = synthetic_updates(placement, seed=6)[0]
    held = list(placement.resident(update.sender))
    assert len(held) == 3

    def claiming(*counts: int) -> FomoeUpdate:
        tokens = torch.zeros_like(update.tokens)
        tokens[:, held] = torch.tensor(counts)
        return FomoeUpdate(update.sender, update.delta, tokens)

    assert update_problem(claiming(24, 24, 0), placement, LAYOUT, limits) is None
    assert "24 tokens of a round" in (update_problem(claiming(25, 0, 0), placement, LAYOUT, limits) or "")
    assert "48 a round routes" in (update_problem(claiming(24, 24, 1), placement, LAYOUT, limits) or "")
    assert update_problem(claiming(10**9, 0, 0), placement, LAYOUT) is None  # no limits: any count passes
    others = [FomoeUpdate(u.sender, u.delta, u.tokens.clamp(max=16)) for u in synthetic_updates(placement, seed=6)[1:]]
    mixed = mix_round([claiming(25, 0, 0), *others], placement, LAYOUT, limits=limits)
    assert [f.sender for f in mixed.rejected] == [update.sender]
    assert mixed.dense_result.used == tuple(u.sender for u in others)


def test_updates_that_do_not_fit_the_placement_are_refused_whole() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=1, round=0)
    good = synthetic_updates(placement, seed=3)
    stranger = FomoeUpdate("zz", good[0].delta, good[0].tokens)
    not_held = next(n for n in LAYOUT.size_bytes if n not in good[1].delta)
    extra = FomoeUpdate(good[1].sender, {**good[1].delta, not_held: torch.zeros(LAYOUT.shapes[not_held])},
                        good[1].tokens)
    claims = good[2].tokens.clone()
    claims[0, next(e for e in range(4) if e not in placement.resident(good[2].sender))] = 5
    lying = FomoeUpdate(good[2].sender, good[2].delta, claims)

    mixed = mix_round([stranger, extra, lying, good[3]], placement, LAYOUT,
                      failures=[Failure(good[0].sender, "timed out")])

    reasons = {f.sender: f.reason for f in mixed.rejected}
    assert set(reasons) == {"zz", good[1].sender, good[2].sender}
    assert "placement" in reasons["zz"] and "do not match" in reasons[good[1].sender]
    assert "does not hold" in reasons[good[2].sender]
    assert mixed.dense_result.used == (good[3].sender,)
    assert len(mixed.experts) == 2 * len(placement.resident(good[3].sender))
    with pytest.raises(NotEnoughUpdates):
        mix_round([stranger], placement, LAYOUT)


def test_byte_formula_matches_the_layout_by_hand() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=2, round=0)
    one_expert = sum(p.numel() * 4 for n, p in build_moe_model(TINY, seed=0).named_parameters()
                     if ".experts.0." in n)
    dense = sum(p.numel() * 4 for n, p in build_moe_model(TINY, seed=0).named_parameters() if ".experts." not in n)

    counted = sync_bytes(LAYOUT, placement)

    assert counted.up_bytes == counted.down_bytes == 4 * dense + 4 * 2 * one_expert
    assert counted.counts_bytes == 4 * 2 * 4 * 8
    idle = sync_bytes(LAYOUT, placement, idle=[(1, 3)])
    assert idle.down_bytes == counted.down_bytes - 2 * LAYOUT.unit_bytes((1, 3))


def test_each_peer_mixes_the_same_from_only_the_parts_addressed_to_it() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=2, round=0)
    updates = synthetic_updates(placement, seed=4)

    for peer in PEERS:
        mine = placement.resident(peer)
        received = [addressed_to(u, peer, placement, LAYOUT) for u in updates]
        full = mix_round(updates, placement, LAYOUT, experts=mine)

        partial = mix_round(received, placement, LAYOUT, experts=mine)

        assert partial.rejected == ()
        for u, r in zip(updates, received, strict=True):
            shared = set(mine) & set(placement.resident(u.sender))
            assert {expert_of(n)[1] for n in r.delta if expert_of(n)} == shared
        assert all(torch.equal(partial.dense[n], full.dense[n]) for n in LAYOUT.dense)
        assert partial.experts.keys() == full.experts.keys()
        for key, got in partial.experts.items():
            assert all(torch.equal(got[n], full.experts[key][n]) for n in got)


def test_an_incomplete_expert_is_refused_and_a_holder_that_sent_nothing_is_a_failure() -> None:
    placement = place_experts(PEERS, n_experts=4, replication=2, round=0)
    updates = synthetic_updates(placement, seed=5)
    sender = updates[0]
    expert = placement.resident(sender.sender)[0]
    one_name = LAYOUT.units[(0, expert)][0]
    cut = FomoeUpdate(sender.sender, {n: t for n, t in sender.delta.items() if n != one_name}, sender.tokens)
    without = FomoeUpdate(sender.sender, {n: t for n, t in sender.delta.items()
                                          if n not in LAYOUT.units[(0, expert)]}, sender.tokens)

    refused = mix_round([cut, *updates[1:]], placement, LAYOUT)
    partial = mix_round([without, *updates[1:]], placement, LAYOUT)

    assert "incomplete" in refused.rejected[0].reason
    assert partial.rejected == ()
    reasons = {f.sender: f.reason for f in partial.expert_results[(0, expert)].rejected}
    assert "sent nothing" in reasons[sender.sender]
