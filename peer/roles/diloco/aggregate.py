"""A learner's pseudo-gradient aggregation: the W2 mix through the run's robust aggregator.

With the ``mean`` aggregator the W2 row's weights are used as they are (renormalised over what
arrived): that is gossip DiLoCo exactly. With a robust aggregator the W2 neighbourhood's
pseudo-gradients (own included) go through it instead; for centered clipping with worker momentum
the momentum buffers live here, one per sender, and the center is this learner's previous
aggregate. A setting the round cannot satisfy (too few arrived for f) falls back to this learner's
own pseudo-gradient and says so in the ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from gossamer.peer.errors import ConfigError
from gossamer.peer.kit.ledger import Exchange
from gossamer.peer.roles.diloco.settings import DilocoSettings
from gossamer.protocols.attacks import ATTACKS
from gossamer.protocols.errors import InvalidSetting, NotEnoughUpdates
from gossamer.protocols.mixing import mix
from gossamer.protocols.robust import (
    Contribution,
    WorkerMomentum,
    build_aggregator,
    clipped_gossip,
    flatten,
    unflatten,
)

Params = dict[str, torch.Tensor]


class PseudoGradientAggregator:
    """Aggregates the W2 neighbourhood's pseudo-gradients for one learner, round after round."""

    def __init__(self, settings: DilocoSettings, *, me: str) -> None:
        self._me = me
        self._plan = settings.mixing
        self._name = settings.aggregator
        params = dict(settings.aggregator_params)
        self._beta = float(params.pop("momentum", 0.9)) if self._name == "centered_clipping_momentum" else None
        self._f = int(params.pop("f", 0))
        self._max_norm = settings.max_norm
        try:
            self._aggregate = build_aggregator(self._name, **params)
        except InvalidSetting as exc:
            raise ConfigError(f"hyper.aggregator: {exc}") from exc
        self._momentum = WorkerMomentum() if self._beta is not None else None
        self._center: torch.Tensor | None = None
        self.note = ""

    def subset_of(self, params: Mapping[str, torch.Tensor], *, round: int | None = None) -> Params:
        """The parameters the W2 mix covers (in ``round``: all of them in an exact round)."""
        return {name: tensor for name, tensor in params.items() if self._plan.covers(name, round=round)}

    def aggregate(self, d: Params, arrived: Mapping[str, Params], *, weights: torch.Tensor, me: int,
                  index_of: Callable[[str], int], ledger: Exchange, round: int | None = None) -> Params:
        """The mixed pseudo-gradient: aggregated on the W2 subset of ``round``, own d elsewhere."""
        self.note = ""
        own = self.subset_of(d, round=round)
        if self._name == "mean":
            mixed, report = mix(me, {me: own, **{index_of(s): v for s, v in arrived.items()}}, weights)
            ledger.used = sorted(s for s in arrived if index_of(s) in report.used)
            return {**d, **mixed}
        contributions = [Contribution(sender=sender, vector=self._smoothed(sender, flatten(params)))
                         for sender, params in {**arrived, self._me: own}.items()]
        try:
            result = self._aggregate(contributions, [], **self._call_params())
        except (InvalidSetting, NotEnoughUpdates) as exc:
            self.note = f"aggregation fell back to the own pseudo-gradient: {exc}"
            return d
        self._center = result.value
        ledger.used = sorted(s for s in result.used if s != self._me)
        ledger.rejected.update({f.sender: f.reason for f in result.rejected})
        return {**d, **unflatten(result.value, own)}

    def _smoothed(self, sender: str, vector: torch.Tensor) -> torch.Tensor:
        if self._momentum is None:
            return vector
        return self._momentum.update(sender, vector, beta=self._beta)

    def _call_params(self) -> dict[str, object]:
        call: dict[str, object] = {"f": self._f, "max_norm": self._max_norm}
        if self._name == "centered_clipping_momentum":
            call["center"] = self._center
        return call


def mix_parameters(x: Params, arrived: Mapping[str, Params], *, weights: torch.Tensor, me: int,
                   index_of: Callable[[str], int], clip_tau: float, max_norm: float | None) -> Params:
    """The W1 parameter mix m_i: the plain weighted mix (renormalised over what arrived), or with
    ``clip_tau > 0`` clipped gossip, x_i + sum_j w_ij clip(x_j - x_i, tau), where a neighbour that
    did not arrive (or was rejected) simply leaves its weight on x_i."""
    if clip_tau <= 0:
        mixed, _report = mix(me, {me: x, **{index_of(s): v for s, v in arrived.items()}}, weights)
        return mixed
    neighbours = [Contribution(sender=s, vector=flatten(v)) for s, v in arrived.items()]
    row = {s: float(weights[me, index_of(s)]) for s in arrived}
    return unflatten(clipped_gossip(flatten(x), neighbours, row, tau=clip_tau, max_norm=max_norm), x)


def parse_attack(spec: str) -> Callable[[Params], Params]:
    """``NAME[:SCALE]`` from the attack library, applied to this learner's outgoing pseudo-gradient
    (experiments and tests only)."""
    name, _, arg = spec.partition(":")
    if name not in ("sign_flip", "gaussian", "random_direction", "nan_update", "inf_update"):
        raise ConfigError(f"--attack {spec!r}: one of sign_flip[:S], gaussian[:SIGMA], random_direction[:S], "
                          "nan_update, inf_update")
    scale = float(arg) if arg else 1.0
    generator = torch.Generator().manual_seed(1234)
    attack = ATTACKS[name]

    def apply(d: Params) -> Params:
        vector = flatten(d)
        if name in ("sign_flip", "random_direction"):
            bad = attack(vector, scale, generator) if name == "random_direction" else attack(vector, scale)
        elif name == "gaussian":
            bad = attack(vector, scale, generator)
        else:
            bad = attack(vector)
        return unflatten(bad, d)

    return apply
