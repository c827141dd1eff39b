"""The learner's W1 parameter mix (plain gossip equals the weighted mean; clipped gossip, with a
fixed radius or by default an adaptive one, bounds how far a Byzantine neighbour can pull this
learner's parameters), its W2 aggregation (peers that withhold their pseudo-gradients are
failures of the round and never switch the defence off) and the ``--attack`` option."""

from __future__ import annotations

import pytest
import torch

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.robust import Contribution, coordinate_median, flatten
from gossamer.protocols.diloco.core.aggregate import (
    PseudoGradientAggregator,
    W2Outcome,
    mix_parameters,
    parse_attack,
    w1_radius,
)
from gossamer.protocols.diloco.core.mixing import MixingPlan, mixing_weights
from gossamer.protocols.diloco.settings import DilocoSettings

IDS = ["a", "b", "c"]


def params(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4, 4), value), "b": torch.full((4,), value)}


def test_plain_mix_is_the_weighted_mean_of_what_arrived() -> None:
    weights = mixing_weights("global", 3, round=0, seed=0)
    m = mix_parameters(params(0.0), {"b": params(3.0), "c": params(6.0)}, weights=weights, me=0,
                       index_of=IDS.index, clip_tau=0.0, max_norm=None)
    assert torch.allclose(m["w"], torch.full((4, 4), 3.0))


def test_clipped_gossip_bounds_a_byzantine_neighbour() -> None:
    weights = mixing_weights("global", 3, round=0, seed=0)
    honest, attacker = params(0.1), params(1e5)
    plain = mix_parameters(params(0.0), {"b": honest, "c": attacker}, weights=weights, me=0,
                           index_of=IDS.index, clip_tau=0.0, max_norm=None)
    clipped = mix_parameters(params(0.0), {"b": honest, "c": attacker}, weights=weights, me=0,
                             index_of=IDS.index, clip_tau=1.0, max_norm=None)
    moved = torch.linalg.vector_norm(torch.cat([clipped["w"].flatten(), clipped["b"]]))
    assert float(plain["w"].max()) > 1e4
    assert float(moved) <= 2 / 3 + 1e-5  # each neighbour moves us by at most w_ij * tau = 1/3



def test_the_default_w1_mix_is_adaptive_clipping_that_bounds_one_poisoned_neighbour() -> None:
    """Issue 30 (3): W1 was a plain average by default; a neighbour holding a noise state pulled
    every learner a third of the way to it."""
    ratio = DilocoSettings().w1_clip_ratio
    assert ratio > 0 and DilocoSettings().w1_clip_tau == 0.0
    weights = mixing_weights("global", 3, round=0, seed=0)
    honest, poisoned = params(0.1), params(1e5)
    m = mix_parameters(params(0.0), {"b": honest, "c": poisoned}, weights=weights, me=0, index_of=IDS.index,
                       clip_tau=0.0, clip_ratio=ratio, max_norm=None)
    radius = ratio * float(torch.linalg.vector_norm(torch.full((20,), 0.1)))
    moved = torch.linalg.vector_norm(torch.cat([m["w"].flatten(), m["b"]]))
    assert float(moved) <= 2 / 3 * radius + 1e-5  # each neighbour moves us by at most w_ij * radius


def test_adaptive_clipping_is_the_plain_mix_bit_for_bit_while_nobody_is_beyond_the_radius() -> None:
    weights = mixing_weights("global", 3, round=0, seed=0)
    arrived = {"b": params(0.3), "c": params(0.5)}
    plain = mix_parameters(params(0.0), arrived, weights=weights, me=0, index_of=IDS.index, clip_tau=0.0,
                           max_norm=None)
    adaptive = mix_parameters(params(0.0), arrived, weights=weights, me=0, index_of=IDS.index, clip_tau=0.0,
                              clip_ratio=2.0, max_norm=None)
    assert all(torch.equal(plain[k], adaptive[k]) for k in plain)
    one = mix_parameters(params(0.0), {"b": params(1e5)}, weights=mixing_weights("global", 2, round=0, seed=0),
                         me=0, index_of=IDS.index, clip_tau=0.0, clip_ratio=2.0, max_norm=None)
    assert float(one["w"][0, 0]) == 5e4  # one neighbour: no median to measure against, the plain mix


def test_the_w1_radius_is_a_ratio_of_the_lower_median_distance() -> None:
    assert w1_radius([1.0, 100.0], ratio=2.0) == 2.0
    assert w1_radius([3.0, 1.0, 1e9], ratio=2.0) == 6.0
    with pytest.raises(InvalidSetting):
        w1_radius([], ratio=2.0)


# -- the W2 pseudo-gradient aggregation: withholding never switches the defence off -----------------

LEARNERS = [f"l{i}" for i in range(8)]  # l0 is this learner; W2 is global


def aggregator_for(name: str, f: int, **params: float) -> PseudoGradientAggregator:
    return PseudoGradientAggregator(name, {"f": f, **params}, plan=MixingPlan(), max_norm=1e4, me="l0")


def pseudo_gradient(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 3, generator=generator) * 0.1 + 1.0, "b": torch.randn(3, generator=generator) * 0.1}


def aggregate_round(aggregator: PseudoGradientAggregator, arrived: dict[str, dict[str, torch.Tensor]],
                    own: dict[str, torch.Tensor], learners: list[str] = LEARNERS) -> W2Outcome:
    silent = {peer: "timed out" for peer in learners[1:] if peer not in arrived}
    weights = mixing_weights("global", len(learners), round=0, seed=0)
    return aggregator.aggregate(own, arrived, weights=weights, me=0, index_of=learners.index, silent=silent)


def test_two_silent_peers_do_not_switch_krum_off() -> None:
    """Krum with f = 2 needs 2f + 3 = 7 usable of the 8; two peers withhold theirs. Before, the
    learner then used its own pseudo-gradient alone; now the round degrades to the coordinate-wise
    median of the six that arrived (it needs 2f + 1 = 5), and says so."""
    aggregator = aggregator_for("krum", 2)
    own = pseudo_gradient(0)
    arrived = {peer: pseudo_gradient(i) for i, peer in enumerate(LEARNERS[1:6], start=1)}
    arrived["l5"] = {name: torch.full_like(t, 1e3) for name, t in arrived["l5"].items()}  # one attacker arrives

    out = aggregate_round(aggregator, arrived, own)

    everyone = [flatten(own), *(flatten(v) for v in arrived.values())]
    median = coordinate_median([Contribution(str(i), v) for i, v in enumerate(everyone)], f=2).value
    torch.testing.assert_close(flatten(out.value), median)
    assert not torch.equal(flatten(out.value), flatten(own))
    assert out.used == tuple(LEARNERS[1:6]) and out.refused == {}  # the silent l6 and l7 stay timed out
    assert "degraded to the coordinate-wise median" in out.note and "needs 7 usable" in out.note


def test_silent_peers_count_as_failures_of_the_round_not_as_a_smaller_round() -> None:
    """Centered clipping with f = 2 of 8 and two silent peers: the six that arrived are enough
    (2f + 1 = 5), nothing degrades, and the silent peers stay failures, not rejections."""
    aggregator = aggregator_for("centered_clipping", 2, tau=0.5)
    arrived = {peer: pseudo_gradient(i) for i, peer in enumerate(LEARNERS[1:6], start=1)}

    out = aggregate_round(aggregator, arrived, pseudo_gradient(0))

    assert out.note == "" and out.used == tuple(LEARNERS[1:6]) and out.refused == {}
    assert bool(torch.isfinite(flatten(out.value)).all())


def test_when_too_many_are_silent_for_f_they_count_as_faulty_and_the_round_still_aggregates() -> None:
    """Krum, f = 2, three of the seven others silent: four usable cannot hold 2 Byzantine (the
    median needs 5), so the silent ones count against f and the median tolerates 1 among the four."""
    aggregator = aggregator_for("krum", 2)
    own = pseudo_gradient(0)
    arrived = {peer: pseudo_gradient(i) for i, peer in enumerate(LEARNERS[1:4], start=1)}

    out = aggregate_round(aggregator, arrived, own)

    everyone = [Contribution(str(i), v) for i, v in enumerate([flatten(own), *(flatten(v) for v in arrived.values())])]
    torch.testing.assert_close(flatten(out.value), coordinate_median(everyone, f=1).value)
    assert "with f=1" in out.note and out.used == tuple(LEARNERS[1:4])


def test_a_neighbourhood_too_small_for_f_falls_back_to_the_own_pseudo_gradient_and_says_so() -> None:
    aggregator = aggregator_for("krum", 2)
    own = pseudo_gradient(0)
    arrived = {peer: pseudo_gradient(i) for i, peer in enumerate(LEARNERS[1:5], start=1)}

    out = aggregate_round(aggregator, arrived, own, learners=LEARNERS[:5])  # Krum with f = 2 needs seven

    assert torch.equal(flatten(out.value), flatten(own))
    assert out.note.startswith("aggregation fell back to the own pseudo-gradient") and "n > 2f + 2" in out.note
    assert out.used == () and out.refused == dict.fromkeys(LEARNERS[1:5], out.note)  # none left unaccounted


def test_the_plain_mean_uses_the_w2_rows_weights_over_what_arrived() -> None:
    aggregator = aggregator_for("mean", 0)
    arrived = {"l1": pseudo_gradient(1), "l2": pseudo_gradient(2)}

    out = aggregate_round(aggregator, arrived, pseudo_gradient(0), learners=LEARNERS[:4])

    mean = torch.stack([flatten(pseudo_gradient(i)) for i in range(3)]).mean(0)
    torch.testing.assert_close(flatten(out.value), mean)
    assert out.used == ("l1", "l2") and out.refused == {} and out.note == ""


@pytest.mark.parametrize(("name", "params", "why"), [("mean", {"f": 1}, "not Byzantine-robust"),
                                                     ("krum", {"f": "two"}, "f must be an integer"),
                                                     ("centered_clipping", {"f": 1, "tau": -1.0}, "tau")])
def test_a_rule_that_cannot_be_built_is_refused_naming_the_aggregator(name: str, params: dict, why: str) -> None:
    with pytest.raises(InvalidSetting, match=f"hyper.aggregator.*{why}"):
        PseudoGradientAggregator(name, params, plan=MixingPlan(), max_norm=1e4, me="l0")


# -- the --attack option: what a Byzantine learner sends ----------------------------------------------

def test_attack_option_parses_every_attack_and_refuses_the_rest() -> None:
    aggregator = aggregator_for("centered_clipping", 1, tau=0.5)
    for spec in ("sign_flip:10", "gaussian:0.1", "nan_update", "withhold", "radius_sign_flip", "alie", "ipm",
                 "krum_capture", "mimic", "sleeper:3:alie"):
        parse_attack(spec, aggregator)
    for spec in ("label_flip", "alie:2", "sleeper:x:alie", "sleeper:3", "sign_flip:lots"):
        with pytest.raises(InvalidSetting, match="--attack"):
            parse_attack(spec, aggregator)


def test_withholding_sends_nothing_and_the_sleeper_behaves_until_its_round() -> None:
    aggregator = aggregator_for("centered_clipping", 1, tau=0.5)
    d = pseudo_gradient(0)
    assert parse_attack("withhold", aggregator)(d) is None
    sleeper = parse_attack("sleeper:2:sign_flip:3", aggregator)
    sent = [sleeper(d) for _ in range(3)]
    assert sent[0] is d and sent[1] is d
    torch.testing.assert_close(flatten(sent[2]), -3 * flatten(d))


def test_an_adaptive_attacker_uses_what_it_received_and_the_runs_rule() -> None:
    """Against centered clipping (tau 0.5) the radius-aware sign flip sits 0.99 tau from the
    median of what it saw, against the honest pull on it; the searched IPM is the strongest eps the
    rule still takes, so it moves the rule's output at least as far as any other eps."""
    aggregator = aggregator_for("centered_clipping", 1, tau=0.5)
    arrived = {peer: pseudo_gradient(i) for i, peer in enumerate(LEARNERS[1:5], start=1)}
    aggregate_round(aggregator, arrived, pseudo_gradient(0))  # the attacker has now seen l1..l4
    own = pseudo_gradient(9)
    honest = [flatten(own), *(flatten(arrived[p]) for p in sorted(arrived))]
    center = coordinate_median([Contribution(str(i), v) for i, v in enumerate(honest)]).value

    flipped = flatten(parse_attack("radius_sign_flip", aggregator)(own))

    assert float((flipped - center).norm()) == pytest.approx(0.99 * 0.5, rel=1e-4)
    assert float(torch.dot(flipped - center, torch.stack(honest).mean(0) - center)) < 0
    assert not torch.equal(flatten(parse_attack("ipm", aggregator)(own)), flatten(own))


@pytest.mark.parametrize("spec", ["radius_sign_flip", "alie", "ipm", "krum_capture", "mimic"])
def test_an_adaptive_attacker_that_has_seen_nothing_yet_still_sends(spec: str) -> None:
    """Round 0: the attacker knows only its own pseudo-gradient, too few for the run's rule."""
    attack = parse_attack(spec, aggregator_for("krum", 1))
    sent = attack(pseudo_gradient(3))
    assert sent is not None and bool(torch.isfinite(flatten(sent)).all())
