"""Centered clipping (Karimireddy, He & Jaggi, ICML 2021), stateless and iterative from the
coordinate-wise median, and clipped gossip (He, Karimireddy & Jaggi 2022). Why the one-step form
with worker momentum was retired: README.md of protocols/core, "Centered clipping"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from gossamer.protocols.core.errors import InvalidSetting
from gossamer.protocols.core.robust.base import (
    AggregateResult,
    Contribution,
    Failure,
    check_params,
    checked,
    norms_pass,
    sanitize,
    screen,
)
from gossamer.protocols.core.robust.kernels import centred_gram, clipping_coefficients, combine, distances_to


def centered_clipping(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), *, f: int = 0,
                      tau: float = 1.0, iters: int = 3, max_norm: float | None = None,
                      expected_numel: int | None = None) -> AggregateResult:
    """Iterative centered clipping from the coordinate-wise median (radius ``tau``, ``iters`` steps).

    Needs n > 2f. ``tau`` is in the units of the updates: pick it near the spread of honest ones.
    """
    check_params(tau=tau, iters=iters)

    def kernel(usable: list[Contribution], _f: int) -> tuple[tuple[torch.Tensor, torch.Tensor], list[float]]:
        center, gram, squares = centred_gram([c.vector for c in usable], center="median")
        return (center, gram), squares

    (center, gram), usable, rejected = checked("centered_clipping", arrived, failures, f=f, min_n=2 * f + 1,
                                               rule="n > 2f", max_norm=max_norm, expected_numel=expected_numel,
                                               kernel=kernel)
    coeffs = clipping_coefficients(gram, tau=tau, iters=iters)
    value = combine([c.vector for c in usable], coeffs.tolist(), center=center, center_coeff=1.0 - float(coeffs.sum()))
    return AggregateResult(value, tuple(c.sender for c in usable), rejected)


def _check_vector(name: str, vector: object, numel: int | None) -> None:
    if not isinstance(vector, torch.Tensor) or vector.dim() != 1 or vector.dtype != torch.float32:
        raise InvalidSetting(f"{name} must be a 1-D float32 tensor")
    if numel is not None and vector.numel() != numel:
        raise InvalidSetting(f"{name} has {vector.numel()} values, expected {numel}")


def clipped_gossip(own: torch.Tensor, neighbours: Sequence[Contribution], weights: Mapping[str, float], *,
                   tau: float, max_norm: float | None = None) -> torch.Tensor:
    """x_i + sum_j w_ij clip(x_j - x_i, tau), in sender order; the self weight is 1 - sum_j w_ij.

    Neighbours that ``sanitize`` rejects contribute nothing, as if they had sent ``own`` (call
    ``sanitize`` first to learn why). Every neighbour needs a weight; weights are >= 0 and sum
    to at most 1.
    """
    check_params(tau=tau, max_norm=max_norm)
    _check_vector("own", own, None)
    _check_gossip_weights(weights)
    usable, _ = screen(neighbours, expected_numel=own.numel())
    missing = sorted(c.sender for c in usable if c.sender not in weights)
    if missing:
        raise InvalidSetting(f"weights has no entry for neighbours {missing}")
    if not usable:
        return own.clone()
    distances, squares = distances_to([c.vector for c in usable], own)
    if not norms_pass(squares, max_norm):  # someone sent NaN, Inf or an absurd norm: drop exactly them
        usable, _ = sanitize(usable, expected_numel=own.numel(), max_norm=max_norm)
        if not usable:
            return own.clone()
        distances, _ = distances_to([c.vector for c in usable], own)
    vectors = [c.vector for c in usable]
    scale = (tau / distances).clamp(max=1.0)
    coeffs = [weights[c.sender] * float(s) for c, s in zip(usable, scale, strict=True)]
    return combine(vectors, coeffs, center=own, center_coeff=1.0 - sum(coeffs))


def _check_gossip_weights(weights: Mapping[str, float]) -> None:
    for sender, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1:
            raise InvalidSetting(f"weights[{sender!r}] must be a number in [0, 1], got {weight!r}")
    if sum(weights.values()) > 1 + 1e-9:
        raise InvalidSetting(f"weights must sum to at most 1 (the rest is the self weight), got {sum(weights.values())}")
