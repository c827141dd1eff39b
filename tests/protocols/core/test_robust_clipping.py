"""protocols.core.robust.clipping and the registry: centered clipping's bound, clipped gossip,
build_aggregator, aggregate_or_degrade, flatten / unflatten."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates
from gossamer.protocols.core.robust import (
    AGGREGATORS,
    DEFAULT,
    Contribution,
    Failure,
    aggregate_or_degrade,
    build_aggregator,
    centered_clipping,
    clipped_gossip,
    coordinate_median,
    flatten,
    krum,
    unflatten,
)
from tests.protocols.core.test_robust import contributions, randoms


@pytest.mark.parametrize(("iters", "tau"), [(1, 0.5), (3, 0.2), (5, 1.0)])
def test_centered_clipping_stays_within_iters_tau_of_the_median_whatever_the_attackers_send(iters: int,
                                                                                           tau: float) -> None:
    """The bound that makes it safe across rounds: no state, and the result is within iters * tau
    of the coordinate-wise median, which the honest majority pins inside its own range."""
    honest = randoms(6, 9, seed=iters)
    attackers = [torch.full((9,), 1e6), torch.full((9,), -1e6)]
    cs = contributions(honest, "h") + contributions(attackers, "b")

    value = centered_clipping(cs, f=2, tau=tau, iters=iters).value

    median = coordinate_median(cs, f=2).value
    stacked = torch.stack(honest)
    assert float((value - median).norm()) <= iters * tau + 1e-5
    assert bool((median >= stacked.min(0).values).all()) and bool((median <= stacked.max(0).values).all())


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
    ("centered_clipping_momentum", {}, "unknown aggregator 'centered_clipping_momentum'"),  # retired
    ("median", {"tau": 1.0}, r"no parameter\(s\) \['tau'\]"),
    ("krum", {"f": -1}, "f must be"),
    ("centered_clipping", {"iters": 0}, "iters must be"),
    ("geometric_median", {"nu": float("nan")}, "nu must be"),
    ("mean", {"trust_weights": 1}, "trust_weights"),
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
    assert DEFAULT == "geometric_median" and DEFAULT in AGGREGATORS


def test_degrades_to_the_median_when_withheld_updates_leave_too_few_for_krum() -> None:
    """f = 2 of 8, two peers silent: Krum needs 2f + 3 = 7 usable and has 6, so the round goes
    to the coordinate-wise median with the same f (needs 5), the silent ones still failures."""
    honest = contributions(randoms(5, 6, seed=5))
    attacker = Contribution("bad", torch.full((6,), 1e4))
    silent = [Failure("s1", "timed out"), Failure("s2", "timed out")]
    arrived = [*honest, attacker]

    result, note = aggregate_or_degrade(functools.partial(krum, f=2), arrived, silent, f=2)

    assert torch.equal(result.value, coordinate_median(arrived, silent, f=2).value)
    assert note.startswith("degraded to the coordinate-wise median") and "needs 7 usable" in note
    assert {x.sender for x in result.rejected} == {"s1", "s2"}
    same, no_note = aggregate_or_degrade(functools.partial(krum, f=1), arrived, silent, f=1)
    assert no_note == "" and torch.equal(same.value, krum(arrived, silent, f=1).value)


def test_degrading_counts_only_the_silent_against_f() -> None:
    """Four arrivals and one silent peer, f = 2: the median with f = 2 needs five, so the silent
    peer counts as one of the faulty and the median tolerates f - 1 = 1 among the four. With
    nothing usable at all the round fails."""
    honest = contributions(randoms(4, 6, seed=6))
    median = functools.partial(coordinate_median, f=2)
    result, note = aggregate_or_degrade(median, honest, [Failure("s", "timed out")], f=2)
    assert "with f=1: 1 peer(s) sent nothing" in note
    torch.testing.assert_close(result.value, coordinate_median(honest, [Failure("s", "timed out")], f=1).value)
    nan = [Contribution("nan", torch.full((6,), math.nan))]
    with pytest.raises(NotEnoughUpdates, match="not even f=0"):
        aggregate_or_degrade(median, nan, [Failure(f"s{i}", "timed out") for i in range(4)], f=2)


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


def test_silent_peers_count_as_faulty_once_the_arrivals_cannot_tolerate_f() -> None:
    """f = 3 of 8 and three peers silent: five arrivals cannot hold 3 Byzantine (the median needs
    7), so the silent ones count against f; the median then tolerates 2 among the five (the most
    the arrivals support, at least f - 3 = 0) instead of stalling the round."""
    arrived = [*contributions(randoms(4, 6, seed=7)), Contribution("bad", torch.full((6,), 1e4))]
    silent = [Failure(f"s{i}", "timed out") for i in range(3)]

    result, note = aggregate_or_degrade(functools.partial(coordinate_median, f=3), arrived, silent, f=3)

    assert torch.equal(result.value, coordinate_median(arrived, silent, f=2).value)
    assert "with f=2: 3 peer(s) sent nothing and count as faulty" in note
    assert float(result.value.abs().max()) < 10  # the one attacker among the arrivals is still outvoted
