"""A learner's mixes over what arrived: the W1 parameter mix (plain, or clipped gossip with a fixed
or an adaptive radius), the W2 pseudo-gradient mix through the run's robust aggregator, and what a
Byzantine learner sends in place of its pseudo-gradient (``--attack``). Tensors in, tensors and a
``W2Outcome`` out; the role writes the outcome into its ledger. Every neighbour that sent nothing
usable is a failure of the round, never a smaller round."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gossamer.protocols.core import attacks
from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates
from gossamer.protocols.core.robust import (
    Contribution,
    Failure,
    aggregate_or_degrade,
    build_aggregator,
    clipped_gossip,
    coordinate_median,
    flatten,
    unflatten,
)
from gossamer.protocols.diloco.core.mixing import MixingPlan, mix

Params = dict[str, torch.Tensor]


def mix_parameters(x: Params, arrived: Mapping[str, Params], *, weights: torch.Tensor, me: int,
                   index_of: Callable[[str], int], clip_tau: float, max_norm: float | None,
                   clip_ratio: float = 0.0) -> Params:
    """The W1 parameter mix m_i. With ``clip_tau > 0``, clipped gossip with that fixed radius,
    x_i + sum_j w_ij clip(x_j - x_i, tau), where a neighbour that did not arrive (or was rejected)
    simply leaves its weight on x_i. Else, with ``clip_ratio > 0`` and two or more neighbours,
    adaptive clipping (``w1_radius``): while no neighbour is beyond the radius, the plain mix
    bit for bit; else clipped gossip with that radius over the weights renormalised over what
    arrived (so it agrees with the plain mix where nothing is clipped). Otherwise the plain mix,
    renormalised over what arrived."""
    plain = clip_tau <= 0 and (clip_ratio <= 0 or len(arrived) < 2)
    if plain:
        return _plain_mix(x, arrived, weights=weights, me=me, index_of=index_of)
    own = flatten(x)
    neighbours = [Contribution(sender=s, vector=flatten(v)) for s, v in arrived.items()]
    row = {s: float(weights[me, index_of(s)]) for s in arrived}
    tau = clip_tau
    if clip_tau <= 0:
        distances = [float(torch.linalg.vector_norm(c.vector - own)) for c in neighbours]
        tau = w1_radius(distances, ratio=clip_ratio)
        if all(d <= tau for d in distances):
            return _plain_mix(x, arrived, weights=weights, me=me, index_of=index_of)
        if tau == 0.0:  # most neighbours hold exactly x_i: the rest are clipped to nothing
            return {name: t.clone() for name, t in x.items()}
        total = float(weights[me, me]) + sum(row.values())
        row = {s: w / total for s, w in row.items()}
    return unflatten(clipped_gossip(own, neighbours, row, tau=tau, max_norm=max_norm), x)


def _plain_mix(x: Params, arrived: Mapping[str, Params], *, weights: torch.Tensor, me: int,
               index_of: Callable[[str], int]) -> Params:
    mixed, _report = mix(me, {me: x, **{index_of(s): v for s, v in arrived.items()}}, weights)
    return mixed


def w1_radius(distances: Sequence[float], *, ratio: float) -> float:
    """The adaptive W1 clipping radius: ``ratio`` times the lower median of the neighbours'
    distances to our own parameters. While fewer than half of the neighbours are Byzantine the
    lower median is an honest neighbour's distance or below, so none of them moves us by more
    than w_ij x ratio x that distance in a round."""
    if not distances or ratio <= 0:
        raise InvalidSetting(f"w1_radius needs distances and a ratio > 0, got {len(distances)} and {ratio}")
    ordered = sorted(distances)
    return ratio * ordered[(len(ordered) - 1) // 2]


@dataclass(frozen=True)
class W2Outcome:
    """What one W2 mix did: the mixed pseudo-gradient (the own d outside the round's W2 subset),
    the neighbours it used, those it refused (sender -> why; the silent ones are not repeated
    here) and a note when it degraded or fell back to the own pseudo-gradient ('' otherwise)."""

    value: Params
    used: tuple[str, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)
    note: str = ""


class PseudoGradientAggregator:
    """The W2 mix of one learner (``me``), round after round. With ``mean`` the W2 row's weights
    are used as they are, renormalised over what arrived (gossip DiLoCo exactly); with a robust
    rule the neighbourhood's pseudo-gradients (own included) go through it, the silent neighbours
    as failures; a rule the arrivals cannot support degrades (``robust.aggregate_or_degrade``), and
    one that cannot run at all falls back to the own pseudo-gradient, refusing what arrived."""

    def __init__(self, name: str, params: Mapping[str, Any], *, plan: MixingPlan, max_norm: float, me: str) -> None:
        self._me, self._plan, self._max_norm = me, plan, max_norm
        self.name = name
        params = dict(params)
        try:
            self.f = f = int(params.pop("f", 0))
        except (TypeError, ValueError) as exc:
            raise InvalidSetting(f"hyper.aggregator.f must be an integer: {exc}") from exc
        if name == "mean" and f:
            raise InvalidSetting(f"hyper.aggregator: mean is not Byzantine-robust; it needs f = 0, got f = {f}")
        self.params = params
        try:
            self.rule = build_aggregator(name, **({"f": f} if name != "mean" else {}), max_norm=max_norm, **params)
        except InvalidSetting as exc:
            raise InvalidSetting(f"hyper.aggregator: {exc}") from exc
        self.received: list[torch.Tensor] = []
        """The flat pseudo-gradients of the last round's neighbours (what a Byzantine learner sees)."""

    def subset_of(self, params: Mapping[str, torch.Tensor], *, round: int | None = None) -> Params:
        """The parameters the W2 mix covers (in ``round``: all of them in an exact round)."""
        return {name: tensor for name, tensor in params.items() if self._plan.covers(name, round=round)}

    def aggregate(self, d: Params, arrived: Mapping[str, Params], *, weights: torch.Tensor, me: int,
                  index_of: Callable[[str], int], silent: Mapping[str, str], round: int | None = None) -> W2Outcome:
        """The mixed pseudo-gradient of ``d`` (this learner's, index ``me`` of ``weights``) with
        the neighbours' that ``arrived``; ``silent``: the neighbours that sent nothing usable in
        time (sender -> why: timed out, or refused when it came)."""
        own = self.subset_of(d, round=round)
        self.received = [flatten(params) for _, params in sorted(arrived.items())]
        if self.name == "mean":
            mixed, report = mix(me, {me: own, **{index_of(s): v for s, v in arrived.items()}}, weights)
            return W2Outcome({**d, **mixed}, used=tuple(sorted(s for s in arrived if index_of(s) in report.used)))
        contributions = [Contribution(sender=sender, vector=flatten(params))
                         for sender, params in {**arrived, self._me: own}.items()]
        failures = [Failure(sender, why) for sender, why in silent.items() if sender not in arrived]
        try:
            result, note = aggregate_or_degrade(self.rule, contributions, failures, f=self.f, max_norm=self._max_norm)
        except (InvalidSetting, NotEnoughUpdates) as exc:
            note = f"aggregation fell back to the own pseudo-gradient: {exc}"
            return W2Outcome(d, refused=dict.fromkeys(arrived, note), note=note)  # accounted, not used
        refused = {failure.sender: failure.reason for failure in result.rejected if failure.sender not in silent}
        used = tuple(sorted(s for s in result.used if s != self._me))
        return W2Outcome({**d, **unflatten(result.value, own)}, used=used, refused=refused, note=note)


CLASSIC = ("sign_flip", "gaussian", "random_direction", "nan_update", "inf_update")
ADAPTIVE = ("radius_sign_flip", "alie", "ipm", "krum_capture", "mimic")
ATTACK_USAGE = ("sign_flip[:S], gaussian[:SIGMA], random_direction[:S], nan_update, inf_update, withhold, "
                "radius_sign_flip, alie, ipm, krum_capture, mimic, sleeper:ROUND:ATTACK")


class OutgoingAttack:
    """What a Byzantine learner sends in place of its pseudo-gradient (``--attack``; experiments and
    tests only); None means it sends nothing (``withhold``).

    Classic attacks transform this learner's own pseudo-gradient. Adaptive ones
    (``protocols.core.attacks.adaptive``) know the run's aggregator and its parameters (the same signed
    manifest) and take as the honest vectors this learner's own pseudo-gradient plus those its W2
    neighbours sent it the round before (they arrive after it must send this round's); its f - 1
    fellow attackers are assumed to send the same vector. ``sleeper:ROUND:ATTACK`` sends the
    honest pseudo-gradient before ROUND, then ATTACK.
    """

    def __init__(self, spec: str, aggregator: PseudoGradientAggregator) -> None:
        name, _, arg = spec.partition(":")
        self.wake_round = 0
        if name == "sleeper":
            round_text, _, spec = arg.partition(":")
            if not round_text.isdigit() or not spec or spec.startswith("sleeper"):
                raise InvalidSetting(f"--attack {name}:{arg!r}: expected sleeper:ROUND:ATTACK")
            self.wake_round, (name, _, arg) = int(round_text), spec.partition(":")
        if name not in (*CLASSIC, *ADAPTIVE, "withhold") or (arg and name not in ("sign_flip", "gaussian",
                                                                                    "random_direction")):
            raise InvalidSetting(f"--attack {spec!r}: one of {ATTACK_USAGE}")
        try:
            self.scale = float(arg) if arg else 1.0
        except ValueError as exc:
            raise InvalidSetting(f"--attack {spec!r}: {arg!r} is not a number") from exc
        self.name, self.aggregator, self.round = name, aggregator, -1
        self.generator = torch.Generator().manual_seed(1234)
        self.mimic_index: int | None = None

    def __call__(self, d: Params) -> Params | None:
        self.round += 1
        if self.round < self.wake_round:
            return d
        if self.name == "withhold":
            return attacks.withhold(d)
        own = self.aggregator.subset_of(d)
        vector = flatten(own)
        bad = self._classic(vector) if self.name in CLASSIC else self._adaptive(vector)
        return {**d, **unflatten(bad, own)}

    def _classic(self, v: torch.Tensor) -> torch.Tensor:
        if self.name == "sign_flip":
            return attacks.sign_flip(v, self.scale)
        if self.name == "gaussian":
            return attacks.gaussian(v, self.scale, self.generator)
        if self.name == "random_direction":
            return attacks.random_direction(v, self.scale, self.generator)
        return attacks.nan_update(v) if self.name == "nan_update" else attacks.inf_update(v)

    def _adaptive(self, own: torch.Tensor) -> torch.Tensor:
        honest = [own, *(v for v in self.aggregator.received if v.numel() == own.numel())]
        copies = max(1, self.aggregator.f)

        def oracle(vector: torch.Tensor) -> torch.Tensor:
            cs = [Contribution(f"honest{i}", v) for i, v in enumerate(honest)]
            cs += [Contribution(f"byzantine{i}", vector) for i in range(copies)]
            try:
                return aggregate_or_degrade(self.aggregator.rule, cs, [], f=self.aggregator.f)[0].value
            except (InvalidSetting, NotEnoughUpdates):  # too little seen yet (round 0): model the rule as a mean
                return torch.stack([c.vector for c in cs]).mean(dim=0)

        if self.name == "radius_sign_flip":
            center = coordinate_median([Contribution(f"honest{i}", v) for i, v in enumerate(honest)]).value
            tau = float(self.aggregator.params.get("tau", 0.0)) or float(
                torch.stack([torch.linalg.vector_norm(v - center) for v in honest]).median()) or 1.0
            return attacks.radius_sign_flip(honest, center, tau)
        if self.name == "mimic":
            if self.mimic_index is None or self.mimic_index >= len(honest):
                self.mimic_index = attacks.most_atypical(honest)
            return attacks.mimic(honest, self.mimic_index)
        search = {"alie": attacks.alie_strongest, "ipm": attacks.ipm_strongest, "krum_capture": attacks.krum_capture}
        return search[self.name](honest, oracle)[1]


def parse_attack(spec: str, aggregator: PseudoGradientAggregator) -> OutgoingAttack:
    """The ``--attack`` option: see ``OutgoingAttack``; InvalidSetting naming ``--attack`` otherwise."""
    return OutgoingAttack(spec, aggregator)
