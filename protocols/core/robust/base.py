"""What every robust aggregator shares: ``Contribution`` (a flat update and its claimed weight),
``Failure``, ``AggregateResult`` (every peer in ``used`` or ``rejected``), sanitizing, and
``prepare``, the common front half (f against n, sanitize, sort by sender)."""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

import torch

from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates


@dataclass(frozen=True, eq=False)
class Contribution:
    """One peer's update for a round: a 1-D float32 vector and the weight the sender claims.

    Robust aggregators ignore ``weight``; only ``mean(trust_weights=True)`` reads it.
    """

    sender: str
    vector: torch.Tensor
    weight: float = 1.0


@dataclass(frozen=True)
class Failure:
    """A peer whose contribution was not used, and why (timed out, rejected, not selected)."""

    sender: str
    reason: str


@dataclass(frozen=True, eq=False)
class AggregateResult:
    """The aggregate, the senders it was computed from (sorted), and everyone else with a reason."""

    value: torch.Tensor
    used: tuple[str, ...]
    rejected: tuple[Failure, ...]


def flatten(params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Concatenate floating-point tensors, in sorted name order, into one float32 vector."""
    if not params:
        raise InvalidSetting("params is empty: nothing to flatten")
    for name, tensor in params.items():
        if not tensor.is_floating_point():
            raise InvalidSetting(f"params[{name!r}] has dtype {tensor.dtype}; only floating point is flattened")
    return torch.cat([params[name].detach().reshape(-1).to(torch.float32) for name in sorted(params)])


def unflatten(vec: torch.Tensor, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Split ``vec`` back into tensors shaped (and typed) like ``like``; views of ``vec`` where possible."""
    total = sum(tensor.numel() for tensor in like.values())
    if vec.dim() != 1 or vec.numel() != total:
        raise InvalidSetting(f"vec has shape {tuple(vec.shape)}, expected ({total},) to match like")
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name in sorted(like):
        ref = like[name]
        out[name] = vec[offset:offset + ref.numel()].view(ref.shape).to(ref.dtype)
        offset += ref.numel()
    return out


def sanitize(contributions: Sequence[Contribution], *, expected_numel: int,
             max_norm: float | None) -> tuple[list[Contribution], list[Failure]]:
    """Split contributions into usable ones (sorted by sender) and rejected ones with a reason.

    Rejected: not a 1-D float32 tensor of ``expected_numel`` values, NaN or Inf, a norm that
    overflows float32 or exceeds ``max_norm``, a claimed weight that is not finite and positive,
    and every contribution of a sender that sent more than one (none of them is kept).
    """
    check_optional_positive("max_norm", max_norm)
    kept, rejected = screen(contributions, expected_numel=expected_numel)
    usable: list[Contribution] = []
    for contribution in kept:
        problem = _value_problem(contribution.vector, max_norm)
        if problem is None:
            usable.append(contribution)
        else:
            rejected.append(Failure(contribution.sender, problem))
    return usable, sorted(rejected, key=lambda x: x.sender)


def screen(contributions: Sequence[Contribution], *, expected_numel: int) -> tuple[list[Contribution], list[Failure]]:
    """``sanitize`` without reading the values: type, dtype, shape, claimed weight and duplicate
    senders only. The kernels compute every input's squared norm in their first pass, and
    ``checked`` runs the full ``sanitize`` only when one of them is not finite or too large."""
    check_positive_int("expected_numel", expected_numel)
    counts = Counter(c.sender for c in contributions)
    kept: list[Contribution] = []
    rejected: list[Failure] = []
    for contribution in sorted(contributions, key=lambda c: c.sender):
        sender = contribution.sender
        if counts[sender] > 1:
            if not rejected or rejected[-1].sender != sender:
                rejected.append(Failure(sender, f"duplicate sender: {counts[sender]} contributions, none kept"))
            continue
        problem = _form_problem(contribution, expected_numel)
        if problem is None:
            kept.append(contribution)
        else:
            rejected.append(Failure(sender, problem))
    return kept, rejected


def _form_problem(contribution: Contribution, expected_numel: int) -> str | None:
    """Why a contribution's form (not its values) makes it unusable, or None."""
    vector, weight = contribution.vector, contribution.weight
    if not isinstance(vector, torch.Tensor):
        return f"vector is a {type(vector).__name__}, not a tensor"
    if vector.dtype != torch.float32:
        return f"dtype {vector.dtype}, expected torch.float32"
    if vector.dim() != 1 or vector.numel() != expected_numel:
        return f"shape {tuple(vector.shape)}, expected ({expected_numel},)"
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) or weight <= 0:
        return f"claimed weight {weight!r} is not a finite positive number"
    return None


def _value_problem(vector: torch.Tensor, max_norm: float | None) -> str | None:
    """Why a well-formed vector's values make it unusable, or None."""
    norm = float(torch.linalg.vector_norm(vector))
    if not math.isfinite(norm):
        return "contains NaN or Inf" if not bool(torch.isfinite(vector).all()) else "norm overflows float32"
    if max_norm is not None and norm > max_norm:
        return f"norm {norm:.4g} exceeds max_norm {max_norm:g}"
    return None


def norms_pass(squares: Sequence[float], max_norm: float | None) -> bool:
    """Whether every squared norm a kernel saw is finite and within ``max_norm``."""
    limit = math.inf if max_norm is None else max_norm * max_norm
    return all(math.isfinite(square) and square <= limit for square in squares)


Result = TypeVar("Result")


def checked(name: str, arrived: Sequence[Contribution], failures: Sequence[Failure], *, f: int, min_n: int,
            rule: str, max_norm: float | None, expected_numel: int | None,
            kernel: Callable[[list[Contribution], int], tuple[Result, Sequence[float]]],
            ) -> tuple[Result, list[Contribution], tuple[Failure, ...]]:
    """``prepare`` with the value checks folded into the kernel's own pass.

    ``kernel(usable, f_left)`` returns its result and the usable inputs' squared norms. When all
    are finite and within ``max_norm`` (every honest round) that is the answer: one read of the
    inputs. Otherwise (or when the screened round is already short) the full ``prepare``
    (``sanitize``) says exactly who is rejected and why, and the kernel runs again on the rest.
    Returns (result, usable, rejected).
    """
    try:
        usable, rejected, f_left = prepare(name, arrived, failures, f=f, min_n=min_n, rule=rule, max_norm=max_norm,
                                           expected_numel=expected_numel, read_values=False)
    except NotEnoughUpdates:  # perhaps only short of what senders that sanitize catches would free up
        usable = []
    if usable:
        result, squares = kernel(usable, f_left)
        if norms_pass(squares, max_norm):
            return result, usable, rejected
    usable, rejected, f_left = prepare(name, arrived, failures, f=f, min_n=min_n, rule=rule, max_norm=max_norm,
                                       expected_numel=expected_numel)
    return kernel(usable, f_left)[0], usable, rejected


def prepare(name: str, arrived: Sequence[Contribution], failures: Sequence[Failure], *, f: int,
            min_n: int, rule: str, max_norm: float | None, expected_numel: int | None,
            read_values: bool = True) -> tuple[list[Contribution], tuple[Failure, ...], int]:
    """Check ``f``, sanitize, and return the usable contributions sorted by sender, all failures,
    and the f that still applies to the usable ones.

    ``min_n`` (= 2f + c) is the least number of contributions ``name`` needs for ``f`` (``rule``
    says why). The round's size n = arrived + failures below ``min_n`` is a setting that can never
    be robust (``InvalidSetting``). Contributions that ``sanitize`` rejects (NaN, Inf, absurd norm,
    wrong shape) are Byzantine or broken and are out of the round, so they may count against f:
    the aggregator runs with the largest f' <= f the usable count supports (2f' + c <= usable),
    and never needs f' below f - k for k caught. (Without this, f NaN senders would stall every
    round: the usable honest n - f never reach 2f + c.)
    Fewer usable than that is ``NotEnoughUpdates``. ``read_values=False`` only screens the form
    (``screen``): the caller then checks the norms itself (``checked``).
    """
    check_count("f", f)
    size = len(arrived) + len(failures)
    if not arrived:
        raise NotEnoughUpdates(f"{name}: nothing arrived (n={size})")
    if size < min_n:
        raise InvalidSetting(f"{name} needs {rule}, got f={f}, n={size}")
    numel = expected_numel if expected_numel is not None else majority_numel(arrived)
    if read_values:
        usable, bad = sanitize(arrived, expected_numel=numel, max_norm=max_norm)
    else:
        check_optional_positive("max_norm", max_norm)
        usable, bad = screen(arrived, expected_numel=numel)
    rejected = (*failures, *bad)
    caught, extra = min(len(bad), f), min_n - 2 * f
    f_left = max(f - caught, min(f, (len(usable) - extra) // 2))  # as robust as the usable count allows
    needed = 2 * f_left + extra
    if len(usable) < needed:
        raise NotEnoughUpdates(f"{name} with f={f} ({caught} caught by sanitize) needs {needed} usable contributions "
                               f"({rule}), got {len(usable)} of n={size}: "
                               + "; ".join(f"{x.sender}: {x.reason}" for x in rejected))
    return usable, rejected, f_left


def majority_numel(arrived: Sequence[Contribution]) -> int:
    """The vector size most contributions have (an honest majority decides it)."""
    counts = Counter(c.vector.numel() for c in arrived if isinstance(c.vector, torch.Tensor))
    ranked = counts.most_common(2)
    if not ranked:
        raise NotEnoughUpdates("no contribution holds a tensor")
    if len(ranked) == 2 and ranked[0][1] == ranked[1][1]:
        raise NotEnoughUpdates(f"no majority vector size among arrived ({dict(counts)}); pass expected_numel")
    return ranked[0][0]


def check_count(name: str, value: object) -> None:
    """``value`` must be an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidSetting(f"{name} must be an integer >= 0, got {value!r}")


def check_positive_int(name: str, value: object) -> None:
    """``value`` must be an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSetting(f"{name} must be an integer >= 1, got {value!r}")


def check_positive(name: str, value: object) -> None:
    """``value`` must be a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise InvalidSetting(f"{name} must be a finite number > 0, got {value!r}")


def check_nonnegative(name: str, value: object) -> None:
    """``value`` must be a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise InvalidSetting(f"{name} must be a finite number >= 0, got {value!r}")


def check_optional_positive(name: str, value: object) -> None:
    """``value`` must be None or a finite number > 0."""
    if value is not None:
        check_positive(name, value)


def check_optional_positive_int(name: str, value: object) -> None:
    """``value`` must be None or an int >= 1."""
    if value is not None:
        check_positive_int(name, value)


def check_bool(name: str, value: object) -> None:
    """``value`` must be a bool."""
    if not isinstance(value, bool):
        raise InvalidSetting(f"{name} must be True or False, got {value!r}")


PARAMETER_CHECKS: Mapping[str, Callable[[str, object], None]] = MappingProxyType({
    "f": check_count, "max_norm": check_optional_positive, "expected_numel": check_optional_positive_int,
    "trust_weights": check_bool, "nu": check_positive, "max_iters": check_positive_int,
    "tol": check_nonnegative, "m": check_optional_positive_int, "tau": check_positive,
    "iters": check_positive_int,
})
"""How each aggregator parameter is validated (by name), at call time and in ``build_aggregator``."""


def check_params(**params: object) -> None:
    """Validate aggregator parameters by name (unknown names are the caller's business)."""
    for name, value in params.items():
        check = PARAMETER_CHECKS.get(name)
        if check is not None:
            check(name, value)
