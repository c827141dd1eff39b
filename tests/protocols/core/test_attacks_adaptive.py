"""protocols.core.attacks.adaptive: each adaptive attack does what its threat model says against the
rule it targets: it sits where the rule cannot filter it, or is the strongest the rule still takes."""

from __future__ import annotations

import functools

import pytest
import torch

from gossamer.protocols.core import attacks
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.robust import Contribution, centered_clipping, coordinate_median, krum, mean

N_HONEST, F = 6, 2


def honest_vectors(d: int = 40, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(d, generator=generator) * 0.5 + 1.0 for _ in range(N_HONEST)]


def oracle(rule, honest: list[torch.Tensor]):
    """What ``rule`` outputs when the F attackers all send a given vector."""
    def aggregate(vector: torch.Tensor) -> torch.Tensor:
        cs = [Contribution(f"h{i}", v) for i, v in enumerate(honest)]
        cs += [Contribution(f"b{i}", vector) for i in range(F)]
        return rule(cs, ()).value
    return aggregate


def damage(rule, honest: list[torch.Tensor], vector: torch.Tensor) -> float:
    return float((oracle(rule, honest)(vector) - torch.stack(honest).mean(0)).norm())


def test_radius_sign_flip_sits_just_inside_the_radius_against_the_honest_pull() -> None:
    honest, tau = honest_vectors(), 0.8
    center = torch.linspace(-1, 1, 40)
    out = attacks.radius_sign_flip(honest, center, tau)
    pull = torch.stack(honest).mean(0) - center
    assert float((out - center).norm()) == pytest.approx(0.99 * tau, rel=1e-5)
    assert float(torch.nn.functional.cosine_similarity(out - center, pull, dim=0)) == pytest.approx(-1.0)
    with pytest.raises(InvalidSetting, match="tau"):
        attacks.radius_sign_flip(honest, center, 0.0)


def test_radius_sign_flip_is_never_clipped_so_one_clipping_step_moves_by_f_over_n_tau() -> None:
    honest, tau = honest_vectors(), 0.3
    center = coordinate_median([Contribution(f"h{i}", v) for i, v in enumerate(honest)]).value
    attacker = attacks.radius_sign_flip(honest, center, tau)
    with_attack = oracle(functools.partial(centered_clipping, f=F, tau=tau, iters=1), honest)(attacker)
    without = oracle(functools.partial(centered_clipping, f=F, tau=tau, iters=1), honest)(center)  # a null attacker
    moved = float(torch.dot(without - with_attack, attacks.direction(torch.stack(honest).mean(0) - center)))
    assert moved > 0.9 * F / (N_HONEST + F) * 0.99 * tau


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9])
def test_invert_momentum_lands_the_momentum_on_the_target(beta: float) -> None:
    target, previous = honest_vectors(seed=1)[:2]
    sent = attacks.invert_momentum(target, previous, beta=beta)
    torch.testing.assert_close(beta * previous + (1 - beta) * sent, target)
    assert torch.equal(attacks.invert_momentum(target, None, beta=beta), target)
    with pytest.raises(InvalidSetting, match="beta"):
        attacks.invert_momentum(target, previous, beta=1.0)


def test_strongest_asks_the_target_and_keeps_the_most_harmful_strength() -> None:
    honest = honest_vectors(seed=2)
    honest_mean = torch.stack(honest).mean(0)
    make = lambda eps: honest_mean * -eps  # noqa: E731
    strengths = [0.5, 2.0, 8.0]
    assert attacks.strongest(make, strengths, oracle(mean, honest), honest_mean)[0] == 8.0  # the mean filters nothing
    _, vector = attacks.strongest(make, strengths, oracle(functools.partial(krum, f=F), honest), honest_mean)
    assert all(damage(functools.partial(krum, f=F), honest, vector)
               >= damage(functools.partial(krum, f=F), honest, make(s)) for s in strengths)
    with pytest.raises(InvalidSetting):
        attacks.strongest(make, [], oracle(mean, honest), honest_mean)


def test_alie_and_ipm_searches_pick_the_strongest_strength_their_target_still_takes() -> None:
    honest = honest_vectors(seed=3)
    rule = functools.partial(krum, f=F)
    z, alie_vector = attacks.alie_strongest(honest, oracle(rule, honest))
    assert z in attacks.ALIE_ZS and z > 0
    stacked = torch.stack(honest)
    assert all(damage(rule, honest, alie_vector) >= damage(rule, honest, stacked.mean(0) - other * stacked.std(0, correction=0))
               for other in attacks.ALIE_ZS)
    eps, _ = attacks.ipm_strongest(honest, oracle(mean, honest))
    assert eps == max(attacks.IPM_EPSILONS)


def test_krum_capture_is_selected_by_krum_and_pulls_away_from_the_honest_mean() -> None:
    honest = honest_vectors(seed=4)
    rule = functools.partial(krum, f=F)
    lam, vector = attacks.krum_capture(honest, oracle(rule, honest))
    assert lam > 0
    torch.testing.assert_close(oracle(rule, honest)(vector), vector)  # Krum took the attacker's vector
    closest_honest = min(damage(rule, honest, v) for v in honest)
    assert damage(rule, honest, vector) > closest_honest


def test_mimic_copies_the_most_atypical_honest_peer() -> None:
    honest = honest_vectors(seed=5)
    honest[3] = honest[3] + 5.0
    index = attacks.most_atypical(honest)
    out = attacks.mimic(honest, index)
    assert index == 3 and torch.equal(out, honest[3]) and out.data_ptr() != honest[3].data_ptr()
    with pytest.raises(InvalidSetting, match="index"):
        attacks.mimic(honest, 6)


def test_withhold_sends_nothing_and_the_sleeper_behaves_until_it_wakes() -> None:
    behave, strike = torch.ones(3), torch.full((3,), -7.0)
    assert attacks.withhold(behave) is None
    assert torch.equal(attacks.sleeper(4, 5, behave, lambda: strike), behave)
    assert torch.equal(attacks.sleeper(5, 5, behave, lambda: strike), strike)
    with pytest.raises(InvalidSetting):
        attacks.sleeper(-1, 5, behave, lambda: strike)
