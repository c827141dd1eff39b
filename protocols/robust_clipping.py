"""Centered clipping (Karimireddy, He & Jaggi, ICML 2021), worker momentum, and clipped gossip.

- ``centered_clipping``: stateless and iterative: start from the coordinate-wise median m and
  repeat ``iters`` times c <- c + (1/n) sum_i min(1, tau / ||x_i - c||) (x_i - c). A Byzantine
  input moves c by at most tau / n per iteration, however far away it is.
- ``centered_clipping_momentum``: the paper's one-step form. The center is the previous round's
  aggregate (``center``); one clipping step. Robust over time only when the inputs are *worker
  momenta* (``WorkerMomentum``): momentum averages out the honest noise, so honest inputs sit
  within tau of the previous aggregate and a Byzantine peer cannot hide in the noise.
- ``MomentumCenteredClipping``: the two together, holding the state across rounds; this is what
  ``build_aggregator(DEFAULT, beta=...)`` returns.
- ``clipped_gossip``: decentralised form (He, Karimireddy & Jaggi 2022): peer i moves to
  x_i + sum_j w_ij clip(x_j - x_i, tau), so a Byzantine neighbour moves it by at most w_ij tau.

Where the momentum lives: at the peer that aggregates, one buffer per sender, fed with what that
sender delivered. A Byzantine sender cannot be trusted to apply momentum to its own updates, and
the aggregating peer needs no cooperation from anyone to keep the buffers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from gossamer.protocols.errors import InvalidSetting
from gossamer.protocols.robust_base import (
    AggregateResult,
    Contribution,
    Failure,
    check_params,
    majority_numel,
    prepare,
    sanitize,
)
from gossamer.protocols.robust_kernels import clipping_coefficients, combine, distances_to, median_and_gram


def centered_clipping(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), *, f: int = 0,
                      tau: float = 1.0, iters: int = 3, max_norm: float | None = None,
                      expected_numel: int | None = None) -> AggregateResult:
    """Iterative centered clipping from the coordinate-wise median (radius ``tau``, ``iters`` steps).

    Needs n > 2f. ``tau`` is in the units of the updates: pick it near the spread of honest ones.
    """
    check_params(tau=tau, iters=iters)
    usable, rejected, _f_left = prepare("centered_clipping", arrived, failures, f=f, min_n=2 * f + 1, rule="n > 2f",
                               max_norm=max_norm, expected_numel=expected_numel)
    vectors = [c.vector for c in usable]
    center, gram = median_and_gram(vectors)
    coeffs = clipping_coefficients(gram, tau=tau, iters=iters)
    value = combine(vectors, coeffs.tolist(), center=center, center_coeff=1.0 - float(coeffs.sum()))
    return AggregateResult(value, tuple(c.sender for c in usable), rejected)


def centered_clipping_momentum(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), *,
                               f: int = 0, center: torch.Tensor | None = None, tau: float = 1.0,
                               max_norm: float | None = None,
                               expected_numel: int | None = None) -> AggregateResult:
    """One clipping step around ``center`` (the previous aggregate); feed it worker momenta.

    Without a center (the first round) it is ``centered_clipping`` with one step from the median.
    Needs n > 2f.
    """
    if center is None:
        return centered_clipping(arrived, failures, f=f, tau=tau, iters=1, max_norm=max_norm,
                                 expected_numel=expected_numel)
    check_params(tau=tau)
    _check_vector("center", center, expected_numel)
    usable, rejected, _f_left = prepare("centered_clipping_momentum", arrived, failures, f=f, min_n=2 * f + 1,
                               rule="n > 2f", max_norm=max_norm, expected_numel=center.numel())
    return AggregateResult(_clip_step(usable, center, tau), tuple(c.sender for c in usable), rejected)


def _clip_step(usable: Sequence[Contribution], center: torch.Tensor, tau: float) -> torch.Tensor:
    """center + (1/n) sum_i min(1, tau / ||x_i - center||) (x_i - center)."""
    vectors, n = [c.vector for c in usable], len(usable)
    scale = (tau / distances_to(vectors, center)).clamp(max=1.0)
    return combine(vectors, (scale / n).tolist(), center=center, center_coeff=1.0 - float(scale.sum()) / n)


def _check_vector(name: str, vector: object, numel: int | None) -> None:
    if not isinstance(vector, torch.Tensor) or vector.dim() != 1 or vector.dtype != torch.float32:
        raise InvalidSetting(f"{name} must be a 1-D float32 tensor")
    if numel is not None and vector.numel() != numel:
        raise InvalidSetting(f"{name} has {vector.numel()} values, expected {numel}")


class WorkerMomentum:
    """Momentum buffers of the senders, kept by the peer that aggregates (see the module docstring).

    ``update`` sets m = g for a sender's first vector (as ``torch.optim.SGD`` does) and then
    m = beta m + (1 - beta) g. Feed it only sanitized vectors: one NaN would stay forever.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def update(self, sender: str, vector: torch.Tensor, *, beta: float) -> torch.Tensor:
        """Fold ``vector`` into ``sender``'s momentum and return (a copy of) the new momentum."""
        check_params(beta=beta)
        buffer = self._buffers.get(sender)
        if buffer is None:
            self._buffers[sender] = buffer = vector.detach().clone()
        elif buffer.shape != vector.shape or buffer.dtype != vector.dtype or buffer.device != vector.device:
            raise InvalidSetting(f"momentum of sender {sender!r} is {tuple(buffer.shape)} {buffer.dtype} on "
                                 f"{buffer.device}; got {tuple(vector.shape)} {vector.dtype} on {vector.device}")
        else:
            buffer.mul_(beta).add_(vector, alpha=1.0 - beta)
        return buffer.clone()

    def apply(self, contributions: Sequence[Contribution], *, beta: float) -> list[Contribution]:
        """``update`` every contribution; return contributions carrying the momenta instead."""
        return [Contribution(c.sender, self.update(c.sender, c.vector, beta=beta), c.weight) for c in contributions]

    def forget(self, sender: str) -> None:
        """Drop a sender's buffer (e.g. once it left the run)."""
        self._buffers.pop(sender, None)

    @property
    def senders(self) -> tuple[str, ...]:
        """Senders that have a buffer, sorted."""
        return tuple(sorted(self._buffers))


class MomentumCenteredClipping:
    """Centered clipping with worker momentum, with its state: one instance per aggregation point.

    Each call sanitizes what arrived, folds it into the per-sender momenta, takes one clipping
    step around the previous aggregate (the median on the first round) and remembers the result.
    """

    def __init__(self, *, f: int = 0, tau: float = 1.0, beta: float = 0.9, max_norm: float | None = None,
                 expected_numel: int | None = None) -> None:
        check_params(f=f, tau=tau, beta=beta, max_norm=max_norm, expected_numel=expected_numel)
        self.f, self.tau, self.beta, self.max_norm = f, tau, beta, max_norm
        self.expected_numel = expected_numel
        self.momentum = WorkerMomentum()
        self.center: torch.Tensor | None = None

    def __call__(self, arrived: Sequence[Contribution], failures: Sequence[Failure] = ()) -> AggregateResult:
        numel = self.expected_numel or (self.center.numel() if self.center is not None else majority_numel(arrived))
        usable, rejected, f_left = prepare("centered_clipping_momentum", arrived, failures, f=self.f,
                                           min_n=2 * self.f + 1, rule="n > 2f", max_norm=self.max_norm,
                                           expected_numel=numel)
        momenta = self.momentum.apply(usable, beta=self.beta)
        if self.center is None:  # the first round: one step from the median of the usable momenta
            result = centered_clipping(momenta, (), f=f_left, tau=self.tau, iters=1, expected_numel=numel)
            result = AggregateResult(result.value, result.used, (*rejected, *result.rejected))
        else:
            result = AggregateResult(_clip_step(momenta, self.center, self.tau), tuple(c.sender for c in momenta),
                                     rejected)
        self.center = result.value
        return result


def clipped_gossip(own: torch.Tensor, neighbours: Sequence[Contribution], weights: Mapping[str, float], *,
                   tau: float, max_norm: float | None = None) -> torch.Tensor:
    """x_i + sum_j w_ij clip(x_j - x_i, tau), in sender order; the self weight is 1 - sum_j w_ij.

    Neighbours that ``sanitize`` rejects contribute nothing, as if they had sent ``own`` (call
    ``sanitize`` first to learn why). Every neighbour needs a weight; weights are >= 0 and sum
    to at most 1.
    """
    check_params(tau=tau)
    _check_vector("own", own, None)
    _check_gossip_weights(weights)
    usable, _ = sanitize(neighbours, expected_numel=own.numel(), max_norm=max_norm)
    missing = sorted(c.sender for c in usable if c.sender not in weights)
    if missing:
        raise InvalidSetting(f"weights has no entry for neighbours {missing}")
    vectors = [c.vector for c in usable]
    if not vectors:
        return own.clone()
    scale = (tau / distances_to(vectors, own)).clamp(max=1.0)
    coeffs = [weights[c.sender] * float(s) for c, s in zip(usable, scale, strict=True)]
    return combine(vectors, coeffs, center=own, center_coeff=1.0 - sum(coeffs))


def _check_gossip_weights(weights: Mapping[str, float]) -> None:
    for sender, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1:
            raise InvalidSetting(f"weights[{sender!r}] must be a number in [0, 1], got {weight!r}")
    if sum(weights.values()) > 1 + 1e-9:
        raise InvalidSetting(f"weights must sum to at most 1 (the rest is the self weight), got {sum(weights.values())}")
