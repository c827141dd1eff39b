"""Consensus measurement (distance to the replicas' mean, contraction factors) and the property
issue 15 is about: on shards that differ, gossip replicas with a private outer momentum drift apart,
and the plan's periodic exact average keeps their disagreement bounded."""

from __future__ import annotations

import math

import pytest
import torch

from gossamer.protocols.core.consensus import consensus_distance, contraction_factor, mean_norm, norm_of_mean
from gossamer.protocols.core.errors import ProtocolError
from gossamer.protocols.diloco.core.mixing import MixingPlan, mixing_weights, simulate_round
from gossamer.protocols.diloco.core.replica import DilocoConfig, DilocoReplica
from tests.protocols.diloco.core.test_replica import IN_FEATURES, TRUE_W, make_mlp, mse


def test_consensus_distance_is_the_mean_squared_distance_to_the_mean_per_group() -> None:
    values = [{"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0])},
              {"a": torch.tensor([2.0, 4.0]), "b": torch.tensor([1.0])}]

    cd = consensus_distance(values, {"first": ["a"], "second": ["b"]})

    # mean a = [1, 2]: each replica is (1^2 + 2^2) = 5 away; b agrees
    assert cd == {"first": 5.0, "second": 0.0, "all": 5.0}
    assert consensus_distance([values[0]] * 3) == {"all": 0.0}
    assert mean_norm(values) == pytest.approx((1.0 + math.sqrt(21.0)) / 2)
    assert norm_of_mean(values) == pytest.approx(math.sqrt(1 + 4 + 1))


def test_consensus_distance_refuses_replicas_that_cover_different_names() -> None:
    with pytest.raises(ProtocolError, match="different parameter names"):
        consensus_distance([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])
    with pytest.raises(ProtocolError, match="no replicas"):
        consensus_distance([])


def test_contraction_factor_of_the_topologies_for_eight_peers() -> None:
    ring = contraction_factor(mixing_weights("ring", 8, round=0, seed=0))

    assert ring == pytest.approx(1 / 3 + 2 / 3 * math.cos(2 * math.pi / 8))  # 0.805: a spectral gap of 0.195
    assert contraction_factor(mixing_weights("global", 8, round=0, seed=0)) == pytest.approx(0.0, abs=1e-12)
    assert contraction_factor(mixing_weights("none", 8, round=0, seed=0)) == pytest.approx(1.0)


def shard_batch(worker: int, round: int, step: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker-specific data: each worker fits its own linear target, so pseudo-gradients differ
    persistently (the non-IID shards of a real run)."""
    gen = torch.Generator().manual_seed(100_000 * worker + 1_000 * round + step)
    x = torch.randn(size, IN_FEATURES, generator=gen)
    offset = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]) * (worker - 2.5)
    return x, x @ (TRUE_W + offset) + 0.3 * worker


def disagreement_per_round(plan: MixingPlan, rounds: int) -> list[float]:
    """Consensus distance of the parameters after each round's outer step, 6 replicas."""
    replicas = [DilocoReplica(make_mlp(hidden=8), DilocoConfig(inner_steps=5, inner_lr=2e-2, inner_weight_decay=0.0))
                for _ in range(6)]
    out: list[float] = []
    for t in range(rounds):
        simulate_round(replicas, shard_batch, plan, round=t, seed=0, loss_fn=mse,
                       trace=lambda stage, values: out.append(consensus_distance(values)["all"])
                       if stage == "x_next" else None)
    return out


def test_exact_average_every_k_rounds_bounds_the_drift_of_heterogeneous_replicas() -> None:
    gossip = MixingPlan(w1="ring", w2="ring", w2_subset=("0",), mix_momentum=False)
    averaged = MixingPlan(w1="ring", w2="ring", w2_subset=("0",), mix_momentum=False, average_every=4)

    drift = disagreement_per_round(gossip, 16)
    bounded = disagreement_per_round(averaged, 16)

    assert drift[-1] > 10 * drift[0]  # the private steps pile up: the replicas drift apart
    assert all(bounded[t] == 0.0 for t in range(3, 16, 4))  # identical after every exact round
    assert max(bounded) < 0.5 * max(drift[8:])
