"""Adaptive attacks: each knows the round's honest vectors, its target's rule and parameters and the
rule's public state, and reaches the rule as ``aggregate`` (what the target would output, without
changing its state). Pure (README.md of protocols/core, "Attacks")."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gossamer.protocols.core.errors import InvalidSetting

Oracle = Callable[[torch.Tensor], torch.Tensor]
"""What the target outputs when every attacker sends the given vector (state left untouched)."""

MARGIN = 0.99
"""How far inside the clipping radius the radius-aware sign flip sits (as a fraction of tau)."""
ALIE_ZS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
"""ALIE strengths z searched (mean - z * std, coordinate-wise over the honest vectors)."""
IPM_EPSILONS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0, 8.0, 16.0)
"""IPM strengths eps searched (-eps * honest mean)."""
KRUM_LAMBDAS = (0.0, 0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Krum-capture offsets lambda searched, in units of the honest vectors' mean coordinate spread."""


def _stack(honest: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    if not honest:
        raise InvalidSetting(f"{what} needs at least one honest vector")
    return torch.stack(list(honest))


def direction(v: torch.Tensor) -> torch.Tensor:
    """v / ||v||; the zero vector stays zero."""
    norm = float(torch.linalg.vector_norm(v))
    return v / norm if norm > 0 else torch.zeros_like(v)


def radius_sign_flip(honest: Sequence[torch.Tensor], center: torch.Tensor, tau: float, *,
                     margin: float = MARGIN) -> torch.Tensor:
    """center - margin * tau * u, u the direction from ``center`` to the honest mean: the honest
    pull on the center, sign-flipped and kept just inside the clipping radius ``tau``, so that
    centered clipping takes it whole and it cancels as much of the honest pull as it can, every
    round. Against a rule whose center is its previous aggregate this holds the center back
    where it was (see ``robust_clipping`` on the retired one-step form); the honest direction
    itself is what ``ipm_strongest`` pushes against."""
    if not tau > 0 or not 0 < margin <= 1:
        raise InvalidSetting(f"radius_sign_flip needs tau > 0 and 0 < margin <= 1, got tau={tau}, margin={margin}")
    mean = _stack(honest, "radius_sign_flip").mean(dim=0)
    return center - (margin * tau) * direction(mean - center)


def invert_momentum(target: torch.Tensor, momentum: torch.Tensor | None, *, beta: float) -> torch.Tensor:
    """What to send so that the aggregator's worker momentum m <- beta m + (1 - beta) g of this
    sender lands exactly on ``target``: g = (target - beta m) / (1 - beta). With no buffer yet the
    aggregator starts it at g, so g = target. Worker momentum cannot smooth an attacker who knows it."""
    if not 0 <= beta < 1:
        raise InvalidSetting(f"invert_momentum needs 0 <= beta < 1, got beta={beta}")
    if momentum is None:
        return target.clone()
    return (target - beta * momentum) / (1.0 - beta)


def strongest(make: Callable[[float], torch.Tensor], strengths: Sequence[float], aggregate: Oracle,
              reference: torch.Tensor) -> tuple[float, torch.Tensor]:
    """The strength s (and its vector ``make(s)``) that moves the target's output furthest from
    ``reference`` (the honest mean), asking the target (``aggregate``) for each candidate: the
    strongest attack that still passes its filter (Shejwalkar & Houmansadr, NDSS 2021). The first
    of equally strong candidates wins."""
    if not strengths:
        raise InvalidSetting("strongest needs at least one strength")
    best: tuple[float, float, torch.Tensor] | None = None
    for strength in strengths:
        vector = make(strength)
        damage = float(torch.linalg.vector_norm(aggregate(vector) - reference))
        if best is None or damage > best[0]:
            best = (damage, strength, vector)
    assert best is not None
    return best[1], best[2]


def alie_strongest(honest: Sequence[torch.Tensor], aggregate: Oracle,
                   zs: Sequence[float] = ALIE_ZS) -> tuple[float, torch.Tensor]:
    """ALIE (mean - z * std, coordinate-wise) with the z in ``zs`` that hurts ``aggregate`` most."""
    stacked = _stack(honest, "alie_strongest")
    mean, std = stacked.mean(dim=0), stacked.std(dim=0, correction=0)
    return strongest(lambda z: mean - z * std, zs, aggregate, mean)


def ipm_strongest(honest: Sequence[torch.Tensor], aggregate: Oracle,
                  epsilons: Sequence[float] = IPM_EPSILONS) -> tuple[float, torch.Tensor]:
    """IPM (-eps * honest mean) with the eps in ``epsilons`` that hurts ``aggregate`` most."""
    mean = _stack(honest, "ipm_strongest").mean(dim=0)
    return strongest(lambda eps: mean * -eps, epsilons, aggregate, mean)


def krum_capture(honest: Sequence[torch.Tensor], aggregate: Oracle,
                 lambdas: Sequence[float] = KRUM_LAMBDAS) -> tuple[float, torch.Tensor]:
    """Fang et al. (USENIX Security 2020) against Krum: every attacker sends the same
    mean - lambda * s * sign(mean) (s the honest vectors' mean coordinate spread), with the largest
    harmful lambda that the target still takes: identical copies are each other's nearest
    neighbours, so Krum scores them low and selects one, which then *is* the aggregate."""
    stacked = _stack(honest, "krum_capture")
    mean = stacked.mean(dim=0)
    spread = float(stacked.std(dim=0, correction=0).mean())
    sign = torch.sign(mean)
    return strongest(lambda lam: mean - (lam * spread) * sign, lambdas, aggregate, mean)


def most_atypical(honest: Sequence[torch.Tensor]) -> int:
    """Index of the honest vector farthest from the honest mean (the peer a mimic copies)."""
    stacked = _stack(honest, "most_atypical")
    return int(torch.linalg.vector_norm(stacked - stacked.mean(dim=0), dim=1).argmax())


def mimic(honest: Sequence[torch.Tensor], index: int) -> torch.Tensor:
    """A copy of honest peer ``index``'s vector (Karimireddy, He & Jaggi, ICLR 2022): every attacker
    sends it, so that one peer's data (its shard's bias) counts f + 1 times. Nothing to filter:
    the vector is honest. Choose ``index`` once (``most_atypical``) and keep it."""
    if not 0 <= index < len(honest):
        raise InvalidSetting(f"mimic needs 0 <= index < {len(honest)}, got {index}")
    return honest[index].clone()


def withhold(*_: object) -> None:
    """Send nothing: the attacker is silent and the aggregator must not be switched off by it."""
    return None


def sleeper(round: int, wake_round: int, behave: torch.Tensor,
            strike: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``behave`` (an honest-looking vector) before ``wake_round``, then ``strike()``: trust and
    state (momenta, centers) are built up first, then spent."""
    if round < 0 or wake_round < 0:
        raise InvalidSetting(f"sleeper needs round >= 0 and wake_round >= 0, got {round}, {wake_round}")
    return behave.clone() if round < wake_round else strike()
