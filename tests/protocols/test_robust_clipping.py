"""protocols.robust_clipping and the registry: one-step clipping, worker momentum, clipped gossip,
build_aggregator, flatten / unflatten."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from gossamer.protocols.errors import InvalidSetting
from gossamer.protocols.robust import (
    AGGREGATORS,
    DEFAULT,
    Contribution,
    Failure,
    MomentumCenteredClipping,
    WorkerMomentum,
    build_aggregator,
    centered_clipping,
    centered_clipping_momentum,
    clipped_gossip,
    flatten,
    unflatten,
)
from tests.protocols.test_robust import contributions, randoms, ref_clip_step


@pytest.mark.parametrize(("n", "tau"), [(1, 0.5), (3, 0.1), (5, 1.0), (8, 100.0)])
def test_one_step_clipping_matches_reference(n: int, tau: float) -> None:
    xs, center = randoms(n, 9, seed=n), torch.randn(9, generator=torch.Generator().manual_seed(99))

    result = centered_clipping_momentum(contributions(xs), f=(n - 1) // 2, center=center, tau=tau)

    torch.testing.assert_close(result.value.double(), ref_clip_step(xs, center.double(), tau), atol=1e-5, rtol=1e-5)


def test_one_step_without_center_is_one_step_from_the_median() -> None:
    cs = contributions(randoms(5, 7, seed=1))
    assert torch.equal(centered_clipping_momentum(cs, f=2, tau=0.3).value,
                       centered_clipping(cs, f=2, tau=0.3, iters=1).value)


def test_center_of_wrong_size_refused() -> None:
    with pytest.raises(InvalidSetting, match="center has 4 values, expected 7"):
        centered_clipping_momentum(contributions(randoms(3, 7, seed=0)), center=torch.zeros(4), expected_numel=7)


def test_byzantine_moves_one_clipping_step_by_at_most_tau_f_over_n() -> None:
    honest, center = randoms(6, 5, seed=3, scale=0.001), torch.zeros(5)
    cs = contributions(honest) + contributions([torch.full((5,), 1e6)] * 2, "b")
    value = centered_clipping_momentum(cs, f=2, center=center, tau=0.5).value
    assert float(value.norm()) <= 0.5 * 2 / 8 + 0.001 * 6


def test_worker_momentum_follows_the_recursion_and_keeps_buffers_private() -> None:
    g1, g2, g3 = randoms(3, 4, seed=2)
    momentum = WorkerMomentum()

    first = momentum.update("a", g1, beta=0.9)
    first.add_(100.0)  # a returned copy: the buffer must not change
    second = momentum.update("a", g2, beta=0.9)
    other = momentum.update("b", g3, beta=0.5)

    torch.testing.assert_close(second, 0.9 * g1 + 0.1 * g2)
    assert torch.equal(other, g3) and momentum.senders == ("a", "b")
    with pytest.raises(InvalidSetting, match="sender 'a'"):
        momentum.update("a", torch.zeros(3), beta=0.9)
    with pytest.raises(InvalidSetting, match="beta"):
        momentum.update("a", g1, beta=1.0)
    momentum.forget("a")
    assert momentum.senders == ("b",)


def test_momentum_centered_clipping_keeps_state_across_rounds() -> None:
    rounds = [randoms(5, 6, seed=seed) for seed in range(3)]
    aggregator = MomentumCenteredClipping(f=1, tau=0.4, beta=0.8)
    momentum, center = WorkerMomentum(), None

    for xs in rounds:
        got = aggregator([*contributions(xs), Contribution("nan", torch.full((6,), math.nan))],
                         [Failure("late", "timed out")])
        momenta = momentum.apply(contributions(xs), beta=0.8)
        expected = centered_clipping_momentum(momenta, [Failure("late", "timed out")], f=1, center=center, tau=0.4)
        center = expected.value

        torch.testing.assert_close(got.value, expected.value)
        assert {x.sender for x in got.rejected} == {"late", "nan"}
    assert aggregator.momentum.senders == tuple(f"p{i:02d}" for i in range(5))


def ref_gossip(own: torch.Tensor, xs: list[torch.Tensor], weights: list[float], tau: float) -> torch.Tensor:
    out = own.double().clone()
    for x, w in zip(xs, weights, strict=True):
        diff = x.double() - own.double()
        out += w * diff * min(1.0, tau / float(diff.norm()))
    return out


@pytest.mark.parametrize("tau", [0.05, 1.0, 1e3])
def test_clipped_gossip_matches_reference(tau: float) -> None:
    own, *xs = randoms(5, 8, seed=7)
    weights = [0.1, 0.2, 0.3, 0.15]
    cs = contributions(xs)

    got = clipped_gossip(own, cs, {c.sender: w for c, w in zip(cs, weights, strict=True)}, tau=tau)

    torch.testing.assert_close(got.double(), ref_gossip(own, xs, weights, tau), atol=1e-5, rtol=1e-5)


def test_clipped_gossip_bounds_byzantine_and_ignores_rejected_neighbours() -> None:
    own = torch.zeros(4)
    cs = [Contribution("bad", torch.full((4,), 1e7)), Contribution("nan", torch.full((4,), math.nan))]
    got = clipped_gossip(own, cs, {"bad": 0.25, "nan": 0.25, "absent": 0.5}, tau=2.0)
    assert float(got.norm()) == pytest.approx(0.25 * 2.0)
    with pytest.raises(InvalidSetting, match=r"\['bad'\]"):
        clipped_gossip(own, cs, {"nan": 0.5}, tau=1.0)
    with pytest.raises(InvalidSetting, match="sum to at most 1"):
        clipped_gossip(own, cs, {"bad": 0.7, "nan": 0.7}, tau=1.0)
    with pytest.raises(InvalidSetting, match="tau"):
        clipped_gossip(own, cs, {"bad": 0.5}, tau=0.0)


@pytest.mark.parametrize(("name", "params", "match"), [
    ("nope", {}, "unknown aggregator 'nope'"),
    ("median", {"tau": 1.0}, r"no parameter\(s\) \['tau'\]"),
    ("krum", {"f": -1}, "f must be"),
    ("centered_clipping", {"iters": 0}, "iters must be"),
    ("geometric_median", {"nu": float("nan")}, "nu must be"),
    ("mean", {"trust_weights": 1}, "trust_weights"),
    (DEFAULT, {"beta": 1.5}, "beta must be"),
    (DEFAULT, {"beta": 0.9, "center": None}, r"no parameter\(s\) \['center'\]"),
    ("centered_clipping", {"beta": 0.9}, r"no parameter\(s\) \['beta'\]"),
])
def test_build_aggregator_refuses_bad_names_and_params(name: str, params: dict, match: str) -> None:
    with pytest.raises(InvalidSetting, match=match):
        build_aggregator(name, **params)


def test_build_aggregator_binds_parameters_and_leaves_the_rest_per_call() -> None:
    cs = contributions(randoms(7, 5, seed=4))
    for name in AGGREGATORS:
        built = build_aggregator(name, max_norm=1e3)
        assert isinstance(built, functools.partial)
        assert built(cs, (), f=0 if name == "mean" else 1).value.shape == (5,)
    trimmed = build_aggregator("trimmed_mean", f=2)
    assert torch.equal(trimmed(cs, ()).value, AGGREGATORS["trimmed_mean"](cs, (), f=2).value)
    one_step = build_aggregator(DEFAULT, tau=0.5)
    center = torch.ones(5)
    assert torch.equal(one_step(cs, (), f=2, center=center).value,
                       centered_clipping_momentum(cs, f=2, tau=0.5, center=center).value)


def test_build_default_with_beta_is_stateful() -> None:
    rounds = [contributions(randoms(5, 4, seed=seed)) for seed in range(2)]
    built = build_aggregator(DEFAULT, f=1, tau=0.5, beta=0.9)
    reference = MomentumCenteredClipping(f=1, tau=0.5, beta=0.9)
    assert DEFAULT == "centered_clipping_momentum" and isinstance(built, MomentumCenteredClipping)
    for cs in rounds:
        assert torch.equal(built(cs, ()).value, reference(cs, ()).value)
    assert built.center is not None and built.momentum.senders == tuple(c.sender for c in rounds[0])


def test_flatten_unflatten_round_trip_in_sorted_name_order() -> None:
    params = {"b.weight": torch.randn(3, 2), "a.bias": torch.randn(4).half(), "c": torch.tensor(2.5)}

    vec = flatten(params)
    back = unflatten(vec, params)

    assert vec.dtype == torch.float32 and vec.shape == (11,)
    assert torch.equal(vec[:4], params["a.bias"].float())
    for name, tensor in params.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    with pytest.raises(InvalidSetting, match="expected \\(11,\\)"):
        unflatten(vec[:10], params)
    with pytest.raises(InvalidSetting, match="steps"):
        flatten({"steps": torch.tensor([3])})
