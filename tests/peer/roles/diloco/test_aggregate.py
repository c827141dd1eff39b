"""The learner's W1 parameter mix: plain gossip equals the weighted mean; clipped gossip bounds how
far a Byzantine neighbour can pull this learner's parameters."""

from __future__ import annotations

import torch

from gossamer.peer.roles.diloco.aggregate import mix_parameters
from gossamer.protocols.mixing import mixing_weights

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
