"""The classic attacks: fixed recipes that do not look at the defence (the table is in the package
docstring). Model-level attacks take the attacker's own honest vector ``v`` (or the honest vectors,
for the omniscient ones); randomness only from a ``torch.Generator`` passed in (on ``v``'s device).
Inputs are never modified.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from statistics import NormalDist

import torch

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.robust.base import Contribution

HUGE_WEIGHT = 1e9


def sign_flip(v: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The honest vector reversed and scaled: -scale * v."""
    return v * -scale


def alie_z(num_workers: int, num_byzantine: int) -> float:
    """z_max of ALIE: s = floor(n/2 + 1) - m supporters needed, z = Phi^-1((n - s) / n)."""
    supporters = num_workers // 2 + 1 - num_byzantine
    if num_byzantine < 1 or supporters < 1:
        raise InvalidSetting(f"alie needs 1 <= num_byzantine <= n/2, got num_byzantine={num_byzantine}, "
                             f"n={num_workers}")
    return NormalDist().inv_cdf((num_workers - supporters) / num_workers)


def alie(honest: Sequence[torch.Tensor], num_byzantine: int, z: float | None = None) -> torch.Tensor:
    """mean - z * std of the honest vectors, coordinate-wise (population std); every attacker sends it."""
    if not honest:
        raise InvalidSetting("alie needs at least one honest vector")
    stacked = torch.stack(list(honest))
    if z is None:
        z = alie_z(len(honest) + num_byzantine, num_byzantine)
    return stacked.mean(dim=0) - z * stacked.std(dim=0, correction=0)


def ipm(honest: Sequence[torch.Tensor], eps: float) -> torch.Tensor:
    """Inner product manipulation: -eps * (mean of the honest vectors)."""
    if not honest:
        raise InvalidSetting("ipm needs at least one honest vector")
    return torch.stack(list(honest)).mean(dim=0) * -eps


def gaussian(v: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """Noise N(0, sigma^2) with v's shape, dtype and device (v's values are not used)."""
    return torch.randn(v.shape, generator=generator, dtype=v.dtype, device=v.device) * sigma


def random_direction(v: torch.Tensor, scale: float, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random direction with norm scale * ||v||."""
    direction = torch.randn(v.shape, generator=generator, dtype=v.dtype, device=v.device)
    return direction * (scale * float(torch.linalg.vector_norm(v)) / float(torch.linalg.vector_norm(direction)))


def stale(history: Sequence[torch.Tensor], lag: int) -> torch.Tensor:
    """The vector of ``lag`` rounds ago from ``history`` (oldest first, current last)."""
    if isinstance(lag, bool) or not isinstance(lag, int) or not 0 <= lag < len(history):
        raise InvalidSetting(f"stale needs 0 <= lag < len(history), got lag={lag!r}, len(history)={len(history)}")
    return history[-1 - lag].clone()


def nan_update(v: torch.Tensor) -> torch.Tensor:
    """A copy of v whose first value is NaN."""
    out = v.clone()
    out.view(-1)[0] = math.nan
    return out


def inf_update(v: torch.Tensor) -> torch.Tensor:
    """A copy of v whose first value is +Inf."""
    out = v.clone()
    out.view(-1)[0] = math.inf
    return out


def huge_weight(contribution: Contribution) -> Contribution:
    """The same contribution claiming weight 1e9 (robust aggregators must not care)."""
    return dataclasses.replace(contribution, weight=HUGE_WEIGHT)


def label_flip(targets: torch.Tensor, num_classes: int = 256) -> torch.Tensor:
    """Data poisoning for byte LMs: y -> num_classes - 1 - y."""
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise InvalidSetting(f"label_flip needs integer targets, got {targets.dtype}")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= num_classes):
        raise InvalidSetting(f"label_flip needs targets in [0, num_classes), got num_classes={num_classes}")
    return (num_classes - 1) - targets
