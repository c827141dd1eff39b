"""protocols.core.attacks: each attack produces what it should, purely, and the aggregators see it (the
adaptive ones in tests/protocols/core/test_attacks_adaptive.py)."""

from __future__ import annotations

import math

import pytest
import torch

from gossamer.protocols.core import attacks
from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.robust import Contribution, coordinate_median, mean, sanitize


def vectors(n: int, d: int = 50, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(d, generator=gen) + 1.0 for _ in range(n)]


@pytest.mark.parametrize("scale", [1.0, 4.0, 0.5])
def test_sign_flip_reverses_direction_with_scale(scale: float) -> None:
    v = vectors(1)[0]
    out = attacks.sign_flip(v, scale)
    assert float(torch.nn.functional.cosine_similarity(out, v, dim=0)) == pytest.approx(-1.0)
    assert float(out.norm()) == pytest.approx(scale * float(v.norm()), rel=1e-6)


@pytest.mark.parametrize(("n", "m", "z"), [(50, 24, 1.7507), (50, 20, 1.1750), (10, 3, 0.5244), (6, 1, 0.0)])
def test_alie_z_follows_the_paper_formula(n: int, m: int, z: float) -> None:
    # s = floor(n/2 + 1) - m, z = Phi^-1((n - s) / n): Phi^-1(0.96), Phi^-1(0.88), Phi^-1(0.7), Phi^-1(0.5)
    assert attacks.alie_z(n, m) == pytest.approx(z, abs=1e-3)


def test_alie_sits_inside_the_honest_range_below_the_mean() -> None:
    honest = vectors(20, d=400, seed=1)
    stacked = torch.stack(honest)

    out = attacks.alie(honest, num_byzantine=5)

    assert bool((out >= stacked.min(dim=0).values).all()) and bool((out <= stacked.max(dim=0).values).all())
    z = attacks.alie_z(25, 5)
    torch.testing.assert_close(out, stacked.mean(dim=0) - z * stacked.std(dim=0, correction=0))
    assert bool((out < stacked.mean(dim=0)).all())
    torch.testing.assert_close(attacks.alie(honest, 5, z=0.0), stacked.mean(dim=0))
    with pytest.raises(InvalidSetting, match="num_byzantine=25"):
        attacks.alie(honest, num_byzantine=25)


def test_ipm_points_against_the_honest_mean() -> None:
    honest = vectors(6, seed=2)
    honest_mean = torch.stack(honest).mean(dim=0)
    out = attacks.ipm(honest, eps=0.1)
    torch.testing.assert_close(out, -0.1 * honest_mean)
    assert float(out @ honest_mean) < 0


def test_gaussian_is_seeded_noise_of_the_right_scale() -> None:
    v = torch.zeros(20_000)
    a = attacks.gaussian(v, 3.0, torch.Generator().manual_seed(5))
    b = attacks.gaussian(v, 3.0, torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.shape == v.shape
    assert float(a.std()) == pytest.approx(3.0, rel=0.05) and abs(float(a.mean())) < 0.1


def test_random_direction_has_the_requested_norm_and_a_random_direction() -> None:
    v = vectors(1, d=1000, seed=3)[0]
    out = attacks.random_direction(v, 2.0, torch.Generator().manual_seed(6))
    assert float(out.norm()) == pytest.approx(2.0 * float(v.norm()), rel=1e-5)
    assert abs(float(torch.nn.functional.cosine_similarity(out, v, dim=0))) < 0.2


def test_stale_returns_the_lagged_vector_without_aliasing() -> None:
    history = vectors(4, seed=4)
    out = attacks.stale(history, lag=2)
    assert torch.equal(out, history[1]) and out.data_ptr() != history[1].data_ptr()
    with pytest.raises(InvalidSetting, match="lag=4"):
        attacks.stale(history, lag=4)


@pytest.mark.parametrize(("attack", "check"), [(attacks.nan_update, math.isnan), (attacks.inf_update, math.isinf)])
def test_non_finite_updates_are_built_and_rejected(attack, check) -> None:
    v = vectors(1, seed=5)[0]
    before = v.clone()
    out = attack(v)
    assert check(float(out[0])) and torch.equal(out[1:], v[1:]) and torch.equal(v, before)
    _, rejected = sanitize([Contribution("x", out)], expected_numel=v.numel(), max_norm=None)
    assert rejected[0].reason == "contains NaN or Inf"


def test_huge_weight_claims_1e9_and_changes_no_default_aggregate() -> None:
    cs = [Contribution(f"p{i}", v) for i, v in enumerate(vectors(5, seed=6))]
    liar = attacks.huge_weight(cs[0])
    assert liar.weight == 1e9 and liar.vector is cs[0].vector and liar.sender == "p0"
    assert torch.equal(mean([liar, *cs[1:]]).value, mean(cs).value)


def test_label_flip_maps_y_to_num_classes_minus_one_minus_y() -> None:
    targets = torch.tensor([0, 1, 65, 255])
    assert attacks.label_flip(targets).tolist() == [255, 254, 190, 0]
    assert attacks.label_flip(torch.tensor([0, 9]), num_classes=10).tolist() == [9, 0]
    with pytest.raises(InvalidSetting, match="num_classes=10"):
        attacks.label_flip(torch.tensor([10]), num_classes=10)
    with pytest.raises(InvalidSetting, match="integer"):
        attacks.label_flip(torch.tensor([1.0]))


def test_median_under_alie_stays_in_the_honest_range() -> None:
    honest = vectors(7, d=200, seed=7)
    byzantine = [attacks.alie(honest, 3)] * 3
    cs = [Contribution(f"h{i}", v) for i, v in enumerate(honest)] + [Contribution(f"b{i}", v) for i, v in
                                                                       enumerate(byzantine)]
    stacked = torch.stack(honest)
    value = coordinate_median(cs, f=3).value
    assert bool((value >= stacked.min(dim=0).values).all()) and bool((value <= stacked.max(dim=0).values).all())


def test_registry_names_every_attack() -> None:
    assert set(attacks.ATTACKS) == {"sign_flip", "alie", "ipm", "gaussian", "random_direction", "stale",
                                    "nan_update", "inf_update", "huge_weight", "label_flip", "radius_sign_flip",
                                    "alie_strongest", "ipm_strongest", "krum_capture", "mimic", "withhold", "sleeper"}
    assert all(callable(fn) for fn in attacks.ATTACKS.values())
