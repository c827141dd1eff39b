"""How far gossip replicas are from agreeing (``consensus_distance`` per parameter group) and how fast
a doubly stochastic mixing matrix brings them together (``contraction_factor``, ||W - J||_2)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from gossamer.protocols.core.errors import ProtocolError

Params = dict[str, torch.Tensor]


def consensus_distance(values: Sequence[Params], groups: Mapping[str, Sequence[str]] | None = None) -> dict[str, float]:
    """(1/n) sum_i ||v_i - mean_j v_j||^2 per group of names (float64), plus ``"all"`` over every
    name in ``values[0]``. ``groups=None`` reports ``"all"`` only."""
    if not values:
        raise ProtocolError("consensus_distance: no replicas")
    names = list(values[0])
    for v in values[1:]:
        if list(v) != names:
            raise ProtocolError("consensus_distance: replicas cover different parameter names")
    per_name = {}
    for name in names:
        stack = torch.stack([v[name].detach().to(torch.float64) for v in values])
        per_name[name] = float(((stack - stack.mean(0)) ** 2).sum()) / len(values)
    out = {group: sum(per_name[n] for n in members) for group, members in (groups or {}).items()}
    out["all"] = sum(per_name.values())
    return out


def mean_norm(values: Sequence[Params]) -> float:
    """The mean over replicas of each one's L2 norm (all its tensors together)."""
    if not values:
        raise ProtocolError("mean_norm: no replicas")
    return sum(_norm(v) for v in values) / len(values)


def norm_of_mean(values: Sequence[Params]) -> float:
    """The L2 norm of the replicas' mean (the part they agree on)."""
    if not values:
        raise ProtocolError("norm_of_mean: no replicas")
    return _norm({name: torch.stack([v[name].to(torch.float64) for v in values]).mean(0) for name in values[0]})


def _norm(params: Params) -> float:
    return float(sum(float((t.detach().to(torch.float64) ** 2).sum()) for t in params.values())) ** 0.5


def contraction_factor(w: torch.Tensor) -> float:
    """||W - J||_2, the largest singular value of W once the consensus direction is removed."""
    if w.dim() != 2 or w.shape[0] != w.shape[1]:
        raise ProtocolError(f"contraction_factor: need a square matrix, got shape {tuple(w.shape)}")
    n = w.shape[0]
    j = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    return float(torch.linalg.matrix_norm(w.to(torch.float64) - j, ord=2))
