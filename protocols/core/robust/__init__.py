"""Byzantine-robust aggregation of flat update vectors: the aggregators, their registry
(``AGGREGATORS``, ``DEFAULT``, ``build_aggregator``) and ``aggregate_or_degrade``. Every aggregator
keeps one contract (README.md of protocols/core, "Robust aggregation"): f checked against n,
inputs sanitized, permutation-invariant, claimed weights ignored, every peer accounted for.

- ``base``      contributions, failures, results, sanitizing and the parameter checks.
- ``kernels``   vectorised kernels: one read of each input, comparator networks, coefficient space.
- ``clipping``  centered clipping and clipped gossip."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import torch

from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates
from gossamer.protocols.core.robust import kernels
from gossamer.protocols.core.robust.base import (
    AggregateResult,
    Contribution,
    Failure,
    check_params,
    checked,
    flatten,
    sanitize,
    unflatten,
)
from gossamer.protocols.core.robust.clipping import centered_clipping, clipped_gossip

__all__ = [
    "AGGREGATORS", "DEFAULT", "AggregateResult", "Contribution", "Failure", "aggregate_or_degrade",
    "build_aggregator", "centered_clipping", "clipped_gossip",
    "coordinate_median", "flatten", "geometric_median", "krum", "mean", "multi_krum", "sanitize",
    "trimmed_mean", "unflatten",
]


def _senders(usable: Sequence[Contribution]) -> tuple[str, ...]:
    return tuple(c.sender for c in usable)


def mean(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), *, f: int = 0,
         trust_weights: bool = False, max_norm: float | None = None,
         expected_numel: int | None = None) -> AggregateResult:
    """The plain mean; weighted by the claimed weights only with ``trust_weights``. Needs f = 0."""
    check_params(f=f, trust_weights=trust_weights)
    if f != 0:
        raise InvalidSetting(f"mean is not Byzantine-robust: it needs f=0, got f={f}, "
                             f"n={len(arrived) + len(failures)}")

    def kernel(usable: list[Contribution], _f: int) -> tuple[torch.Tensor, list[float]]:
        vectors = [c.vector for c in usable]
        if not trust_weights:
            return kernels.mean(vectors)
        weights = [float(c.weight) for c in usable]
        total = sum(weights)
        return kernels.combine(vectors, [w / total for w in weights]), kernels.distances_to(vectors, vectors[0])[1]

    value, usable, rejected = checked("mean", arrived, failures, f=0, min_n=1, rule="n >= 1", max_norm=max_norm,
                                      expected_numel=expected_numel, kernel=kernel)
    return AggregateResult(value, _senders(usable), rejected)


def coordinate_median(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), *, f: int = 0,
                      max_norm: float | None = None, expected_numel: int | None = None) -> AggregateResult:
    """Coordinate-wise median (mean of the two middle values for even n). Needs n > 2f."""
    value, usable, rejected = checked("median", arrived, failures, f=f, min_n=2 * f + 1, rule="n > 2f",
                                      max_norm=max_norm, expected_numel=expected_numel,
                                      kernel=lambda usable, _f: kernels.median([c.vector for c in usable]))
    return AggregateResult(value, _senders(usable), rejected)


def trimmed_mean(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), *, f: int = 0,
                 max_norm: float | None = None, expected_numel: int | None = None) -> AggregateResult:
    """Coordinate-wise mean after dropping the f largest and f smallest values. Needs 2f < n."""
    value, usable, rejected = checked("trimmed_mean", arrived, failures, f=f, min_n=2 * f + 1, rule="2f < n",
                                      max_norm=max_norm, expected_numel=expected_numel,
                                      kernel=lambda usable, f_left: kernels.trimmed_mean([c.vector for c in usable],
                                                                                         f_left))
    return AggregateResult(value, _senders(usable), rejected)


def _gram(usable: list[Contribution], _f: int) -> tuple[tuple[torch.Tensor, torch.Tensor], list[float]]:
    """The mean-centred Gram matrix (rules that never use the center itself)."""
    center, gram, squares = kernels.centred_gram([c.vector for c in usable], center="mean")
    return (center, gram), squares


def geometric_median(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), *, f: int = 0,
                     nu: float = 1e-6, max_iters: int = 100, tol: float = 1e-7, max_norm: float | None = None,
                     expected_numel: int | None = None) -> AggregateResult:
    """Smoothed Weiszfeld: argmin_z sum_i max(nu, ||z - x_i||), from the mean. Needs n > 2f."""
    check_params(nu=nu, max_iters=max_iters, tol=tol)
    (_, gram), usable, rejected = checked("geometric_median", arrived, failures, f=f, min_n=2 * f + 1, rule="n > 2f",
                                          max_norm=max_norm, expected_numel=expected_numel, kernel=_gram)
    coeffs = kernels.weiszfeld(gram, nu=nu, max_iters=max_iters, tol=tol)
    return AggregateResult(kernels.combine([c.vector for c in usable], coeffs.tolist()), _senders(usable), rejected)


def krum(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), *, f: int = 0,
         max_norm: float | None = None, expected_numel: int | None = None) -> AggregateResult:
    """The input closest (summed squared distances) to its n - f - 2 nearest others. Needs n > 2f + 2."""
    return _select("krum", arrived, failures, f=f, m=1, max_norm=max_norm, expected_numel=expected_numel)


def multi_krum(arrived: Sequence[Contribution], failures: Sequence[Failure] = (), *, f: int = 0,
               m: int | None = None, max_norm: float | None = None,
               expected_numel: int | None = None) -> AggregateResult:
    """Mean of the ``m`` inputs with the lowest Krum scores (default n - f). Needs n > 2f + 2, m <= n - f."""
    return _select("multi_krum", arrived, failures, f=f, m=m, max_norm=max_norm, expected_numel=expected_numel)


def _select(name: str, arrived: Sequence[Contribution], failures: Sequence[Failure], *, f: int, m: int | None,
            max_norm: float | None, expected_numel: int | None) -> AggregateResult:
    check_params(m=m)
    size = len(arrived) + len(failures)

    def kernel(usable: list[Contribution], f_left: int) -> tuple[tuple[torch.Tensor, int], list[float]]:
        if m is not None and m > size - f:
            raise InvalidSetting(f"{name} needs m <= n - f, got m={m}, f={f}, n={size}")
        if m is not None and m > len(usable) - f_left:
            raise NotEnoughUpdates(f"{name} needs m <= usable - f, got m={m}, f={f_left}, {len(usable)} usable")
        (_, gram), squares = _gram(usable, f_left)
        return (kernels.krum_scores(gram, f_left), f_left), squares

    (scores, f_left), usable, rejected = checked(name, arrived, failures, f=f, min_n=2 * f + 3, rule="n > 2f + 2",
                                                 max_norm=max_norm, expected_numel=expected_numel, kernel=kernel)
    count = len(usable) - f_left if m is None else m
    order = torch.sort(scores, stable=True).indices.tolist()
    chosen = sorted(order[:count])
    unused = tuple(Failure(usable[i].sender, f"not selected by {name} (score {float(scores[i]):.4g})")
                   for i in sorted(order[count:]))
    vectors = [usable[i].vector for i in chosen]
    value = vectors[0].clone() if count == 1 else kernels.combine(vectors, [1.0 / count] * count)
    return AggregateResult(value, tuple(usable[i].sender for i in chosen), (*rejected, *unused))


AGGREGATORS: Mapping[str, Callable[..., AggregateResult]] = MappingProxyType({
    "mean": mean,
    "median": coordinate_median,
    "trimmed_mean": trimmed_mean,
    "geometric_median": geometric_median,
    "krum": krum,
    "multi_krum": multi_krum,
    "centered_clipping": centered_clipping,
})
"""Aggregators by name; each is ``fn(arrived, failures, *, f=0, ...) -> AggregateResult``."""

DEFAULT = "geometric_median"
"""The aggregator a run gets when its manifest names none."""


def build_aggregator(name: str, **params: object) -> Callable[..., AggregateResult]:
    """The aggregator ``name`` with ``params`` bound (checked now, not at the first round).

    Unbound keyword parameters (e.g. ``f``, ``max_norm``) can still be passed on each call.
    """
    if name not in AGGREGATORS:
        raise InvalidSetting(f"unknown aggregator {name!r}; known: {sorted(AGGREGATORS)}")
    target = AGGREGATORS[name]
    allowed = {p.name for p in inspect.signature(target).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise InvalidSetting(f"aggregator {name!r} has no parameter(s) {unknown}; it takes {sorted(allowed)}")
    check_params(**params)
    return functools.partial(target, **params)


def aggregate_or_degrade(aggregate: Callable[..., AggregateResult], arrived: Sequence[Contribution],
                         failures: Sequence[Failure], *, f: int, max_norm: float | None = None,
                         expected_numel: int | None = None) -> tuple[AggregateResult, str]:
    """``aggregate(arrived, failures)``, or, when fewer usable contributions are left than its rule
    needs (``NotEnoughUpdates``: peers withheld theirs), the most robust rule the arrivals support:

    1. the coordinate-wise median with the same f: it needs only 2f + 1 usable, the least any
       robust rule needs, and assumes nothing about the silent peers;
    2. when fewer than 2f + 1 arrived, the median with the largest f' the arrivals support, but
       never below f - k for k ``failures``: a peer that sent nothing is one of the faulty ones f
       counts (silence is a fault), so at most f - k faulty peers can be among the arrivals.
       Withholding therefore never stalls a round either.

    Returns the result and a note that says why and how far it degraded ('' when it did not);
    raises ``NotEnoughUpdates`` only when not even f - k can be tolerated (contributions that
    arrived but were rejected as well)."""
    try:
        return aggregate(arrived, failures), ""
    except NotEnoughUpdates as exc:
        reason = str(exc)
    for tolerated in range(f, max(0, f - len(failures)) - 1, -1):
        try:
            result = coordinate_median(arrived, failures, f=tolerated, max_norm=max_norm,
                                       expected_numel=expected_numel)
        except NotEnoughUpdates:
            continue
        if tolerated == f:
            return result, f"degraded to the coordinate-wise median ({reason})"
        return result, (f"degraded to the coordinate-wise median with f={tolerated}: {len(failures)} peer(s) sent "
                        f"nothing and count as faulty ({reason})")
    raise NotEnoughUpdates(f"not even f={max(0, f - len(failures))} can be tolerated among what arrived: {reason}")
