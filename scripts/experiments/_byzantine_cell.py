"""One cell of the Byzantine grid (``byzantine.py``): a DiLoCo run on a shared model, one
aggregator, f attackers, one attack; ``Cohort`` the honest learners, ``Target`` the aggregation
point under attack and what an attacker knows of it, ``Attacker`` what the f Byzantine learners
send. Non-arrivals reach the aggregator as failures (``robust.aggregate_or_degrade``), as in the
network learner."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from _common import TextTask, model_config

from gossamer.protocols.core import attacks
from gossamer.protocols.core.errors import InvalidSetting, NotEnoughUpdates, ProtocolError
from gossamer.protocols.core.models import build_model, next_byte_loss
from gossamer.protocols.core.robust import (
    AggregateResult,
    Contribution,
    Failure,
    aggregate_or_degrade,
    build_aggregator,
    centered_clipping,
    coordinate_median,
    flatten,
    unflatten,
)
from gossamer.protocols.core.robust.base import prepare
from gossamer.protocols.core.robust.kernels import combine, distances_to
from gossamer.protocols.diloco.core.replica import DilocoConfig, DilocoReplica, Params

ATTACKS = ("radius_sign_flip", "alie", "ipm", "mimic", "krum_capture", "withhold", "sleeper")
AGGREGATORS = ("mean", "median", "trimmed_mean", "geometric_median", "krum", "multi_krum", "centered_clipping")
MOMENTUM_RULES = ("cc_one_step_momentum", "cc_recentred_momentum")
"""Not in the library (any more): the one-step form with worker momentum that ``robust`` offered as
``centered_clipping_momentum``, and the fix that was measured before it was retired
(``WorkerMomentumClipping``)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Model, schedule and defence parameters of one grid (every cell of a seed sees the same data)."""

    learners: int = 8
    d_model: int = 64
    n_layers: int = 2
    context: int = 32
    batch_size: int = 8
    inner_steps: int = 8
    rounds: int = 40
    inner_lr: float = 3e-3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    seed: int = 0
    tau: float = 0.0  # clipping radius; 0: calibrated (see calibrate_tau)
    beta: float = 0.5  # worker momentum of the momentum aggregators
    wake_round: int = 20  # the sleeper behaves before this round


def sender(i: int) -> str:
    return f"learner{i:02d}"


class Cohort:
    """The honest learners of one run; they share x (every replica applies the same aggregate)."""

    def __init__(self, s: Settings, task: TextTask, device: torch.device, *, trainers: int) -> None:
        config = model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context)
        dc = DilocoConfig(inner_steps=s.inner_steps, inner_lr=s.inner_lr, outer_lr=s.outer_lr,
                          outer_momentum=s.outer_momentum)
        self.replicas = [DilocoReplica(build_model(config, seed=s.seed, device=device), dc) for _ in range(trainers)]
        self.samplers = [task.sampler(i, batch_size=s.batch_size, context=s.context, seed=s.seed)
                         for i in range(trainers)]
        self.device, self.task, self.context = device, task, s.context

    def pseudo_gradients(self) -> list[Params]:
        out = []
        for replica, sampler in zip(self.replicas, self.samplers, strict=True):
            replica.begin_round()
            for _ in range(replica.config.inner_steps):
                replica.inner_step(*sampler.sample(self.device), next_byte_loss)
            out.append(replica.end_inner())
        return out

    def apply(self, aggregate: Params) -> None:
        for replica in self.replicas:
            replica.finish_round(replica.snapshot, aggregate)

    def heldout_loss(self) -> float:
        return self.task.heldout_loss(self.replicas[0].module, context=self.context, device=self.device)


class WorkerMomentumClipping:
    """Centered clipping of worker momenta m_j <- beta m_j + (1 - beta) g_j (one buffer per sender,
    kept here; m_j = g_j at first). ``recentre=False``: the retired ``centered_clipping_momentum``,
    ONE clipping step around the previous aggregate (from the median on the first round).
    ``recentre=True``: the fix that was measured: iterated centered clipping from the momenta's
    coordinate-wise median every round (no center carried over)."""

    def __init__(self, *, f: int, tau: float, beta: float, recentre: bool) -> None:
        self.f, self.tau, self.beta, self.recentre = f, tau, beta, recentre
        self.momenta: dict[str, torch.Tensor] = {}
        self.center: torch.Tensor | None = None

    def peek(self, who: str) -> torch.Tensor | None:
        return self.momenta.get(who)

    def __call__(self, arrived: list[Contribution], failures: list[Failure]) -> AggregateResult:
        usable, rejected, f_left = prepare("worker momentum clipping", arrived, failures, f=self.f,
                                           min_n=2 * self.f + 1, rule="n > 2f", max_norm=None, expected_numel=None)
        for c in usable:
            old = self.momenta.get(c.sender)
            self.momenta[c.sender] = c.vector.clone() if old is None else self.beta * old + (1 - self.beta) * c.vector
        momenta = [Contribution(c.sender, self.momenta[c.sender]) for c in usable]
        if self.recentre or self.center is None:
            value = centered_clipping(momenta, (), f=f_left, tau=self.tau, iters=3 if self.recentre else 1).value
        else:
            vectors, n = [c.vector for c in momenta], len(momenta)
            scale = (self.tau / distances_to(vectors, self.center)[0]).clamp(max=1.0)
            value = combine(vectors, (scale / n).tolist(), center=self.center, center_coeff=1.0 - float(scale.sum()) / n)
        self.center = value
        return AggregateResult(value, tuple(c.sender for c in momenta), rejected)


class Target:
    """The aggregation point under attack and what an attacker knows of it."""

    def __init__(self, name: str, *, f: int, tau: float, beta: float) -> None:
        self.name, self.f, self.tau = name, f, tau
        self.momentum: WorkerMomentumClipping | None = None
        if name in MOMENTUM_RULES:
            self.momentum = WorkerMomentumClipping(f=f, tau=tau, beta=beta, recentre=name == MOMENTUM_RULES[1])
            self.rule: Callable[..., AggregateResult] = self.momentum
        elif name in AGGREGATORS:
            params = {"mean": {}, "centered_clipping": {"f": f, "tau": tau}}.get(name, {"f": f})
            self.rule = build_aggregator(name, **params)
        else:
            raise InvalidSetting(f"aggregator {name!r}: expected one of {AGGREGATORS} or {MOMENTUM_RULES}")
        self.beta = beta if self.momentum is not None else None

    def __call__(self, arrived: list[Contribution], failures: list[Failure]) -> tuple[AggregateResult, str]:
        return aggregate_or_degrade(self.rule, arrived, failures, f=self.f if self.name != "mean" else 0)

    def preview(self, arrived: list[Contribution], failures: list[Failure]) -> torch.Tensor:
        """What the rule would output, its state untouched (the attacker's model of its target)."""
        return copy.deepcopy(self)(arrived, failures)[0].value

    def seen(self, who: str, vector: torch.Tensor) -> torch.Tensor:
        """What the rule clips: the sender's momentum after this vector, or the vector itself."""
        if self.momentum is None or self.beta is None:
            return vector
        previous = self.momentum.peek(who)
        return vector.clone() if previous is None else self.beta * previous + (1 - self.beta) * vector

    def to_send(self, who: str, wanted: torch.Tensor) -> torch.Tensor:
        """The vector that makes the rule see ``wanted`` from ``who`` (inverting its worker momentum)."""
        if self.momentum is None or self.beta is None:
            return wanted
        return attacks.invert_momentum(wanted, self.momentum.peek(who), beta=self.beta)

    def center(self, seen_honest: list[torch.Tensor]) -> torch.Tensor:
        """Where the rule clips around: the previous aggregate for the retired rule, else the
        median, which the honest inputs decide."""
        if self.momentum is not None and not self.momentum.recentre and self.momentum.center is not None:
            return self.momentum.center
        return coordinate_median([Contribution(sender(i), v) for i, v in enumerate(seen_honest)]).value


@dataclass
class Attacker:
    """The f Byzantine learners (the last f indices) and their memory (the mimic's choice)."""

    attack: str
    byzantine: list[str]
    settings: Settings
    mimic_index: int | None = None
    strengths: list[float] = field(default_factory=list)

    def send(self, round: int, honest: list[torch.Tensor], target: Target,
             honest_senders: list[str]) -> dict[str, torch.Tensor | None]:
        if self.attack == "withhold":
            return {who: attacks.withhold() for who in self.byzantine}
        if self.attack == "mimic":
            if self.mimic_index is None:
                self.mimic_index = attacks.most_atypical(honest)
            return {who: attacks.mimic(honest, self.mimic_index) for who in self.byzantine}
        if self.attack == "sleeper":  # honest-looking (the honest mean) until it wakes, then the radius attack
            mean = torch.stack(honest).mean(dim=0)
            strike = self._radius(honest, target, honest_senders) if round >= self.settings.wake_round else {}
            return {who: attacks.sleeper(round, self.settings.wake_round, mean, lambda who=who: strike[who])
                    for who in self.byzantine}
        if self.attack == "radius_sign_flip":
            return dict(self._radius(honest, target, honest_senders))
        return dict(self._searched(honest, target, honest_senders))

    def _radius(self, honest: list[torch.Tensor], target: Target, honest_senders: list[str]) -> dict[str, torch.Tensor]:
        seen = [target.seen(who, v) for who, v in zip(honest_senders, honest, strict=True)]
        wanted = attacks.radius_sign_flip(seen, target.center(seen), self.settings.tau)
        return {who: target.to_send(who, wanted) for who in self.byzantine}

    def _searched(self, honest: list[torch.Tensor], target: Target, honest_senders: list[str]) -> dict[str, torch.Tensor]:
        seen = [target.seen(who, v) for who, v in zip(honest_senders, honest, strict=True)]
        honest_cs = [Contribution(who, v) for who, v in zip(honest_senders, honest, strict=True)]

        def oracle(wanted: torch.Tensor) -> torch.Tensor:
            bad = [Contribution(who, target.to_send(who, wanted)) for who in self.byzantine]
            return target.preview(honest_cs + bad, [])

        search = {"alie": attacks.alie_strongest, "ipm": attacks.ipm_strongest,
                  "krum_capture": attacks.krum_capture}.get(self.attack)
        if search is None:
            raise InvalidSetting(f"attack {self.attack!r}: expected one of {ATTACKS}")
        strength, wanted = search(seen, oracle)
        self.strengths.append(strength)
        return {who: target.to_send(who, wanted) for who in self.byzantine}


def run_cell(aggregator: str, attack: str | None, f: int, s: Settings, task: TextTask, device: torch.device) -> dict:
    """One run: f Byzantine learners with ``attack``; None = no attack, all learners honest, the
    aggregator still configured for f. A round the aggregator cannot aggregate robustly even
    after degrading is applied as a zero update and counted as skipped."""
    honest_count = s.learners - (f if attack else 0)
    honest_senders = [sender(i) for i in range(honest_count)]
    cohort = Cohort(s, task, device, trainers=honest_count)
    target = Target(aggregator, f=f, tau=s.tau, beta=s.beta)
    attacker = Attacker(attack, [sender(i) for i in range(honest_count, s.learners)], s) if attack else None
    skipped, degraded, byzantine_used, trace = 0, 0, [], []
    for round in range(s.rounds):
        try:
            ds = cohort.pseudo_gradients()
        except ProtocolError as error:  # a non-finite inner loss: the shared model blew up
            return {"outcome": "diverged", "detail": str(error), "round": round}
        honest = [flatten(d) for d in ds]
        arrived = [Contribution(who, v) for who, v in zip(honest_senders, honest, strict=True)]
        failures: list[Failure] = []
        if attacker is not None:
            for who, vector in attacker.send(round, honest, target, honest_senders).items():
                if vector is None:
                    failures.append(Failure(who, "timed out"))
                else:
                    arrived.append(Contribution(who, vector))
        try:
            result, note = target(arrived, failures)
        except NotEnoughUpdates:
            skipped += 1
            cohort.apply({name: torch.zeros_like(t) for name, t in ds[0].items()})
            continue
        degraded += bool(note)
        byzantine_used.append(sum(who not in honest_senders for who in result.used))
        trace.append(round_trace(honest, result.value))
        cohort.apply(unflatten(result.value, ds[0]))
    loss = cohort.heldout_loss()
    return {"outcome": "ok" if math.isfinite(loss) else "diverged", "loss": loss, "skipped_rounds": skipped,
            "degraded_rounds": degraded, "byzantine_used": byzantine_used, "trace": trace,
            "strengths": attacker.strengths if attacker else []}


def round_trace(honest: list[torch.Tensor], aggregate: torch.Tensor) -> dict[str, float]:
    """What a round's aggregate did, against the honest pseudo-gradients: the honest mean's norm,
    the honest spread (median distance to their coordinate-wise median), and the aggregate's
    offset from the honest mean, overall and along the honest mean's direction (negative: the
    aggregate lost progress)."""
    mean = torch.stack(honest).mean(dim=0)
    median = coordinate_median([Contribution(sender(i), v) for i, v in enumerate(honest)]).value
    offset = aggregate - mean
    return {"honest_mean_norm": float(mean.norm()),
            "honest_spread": float(torch.stack([(v - median).norm() for v in honest]).median()),
            "offset_norm": float(offset.norm()), "offset_along_mean": float(offset @ attacks.direction(mean))}


def calibrate_tau(s: Settings, task: TextTask, device: torch.device) -> float:
    """Median distance of the honest round-0 pseudo-gradients to their coordinate-wise median:
    the spread of honest updates, in their own units (what the clipping radius should be near)."""
    vectors = [flatten(d) for d in Cohort(s, task, device, trainers=s.learners).pseudo_gradients()]
    center = coordinate_median([Contribution(sender(i), v) for i, v in enumerate(vectors)]).value
    return float(torch.stack([torch.linalg.vector_norm(v - center) for v in vectors]).median())


def refusal(name: str, *, f: int, n: int) -> str | None:
    """Why ``name`` refuses f Byzantine of n (InvalidSetting on a full round), or None."""
    dummies = [Contribution(sender(i), torch.arange(4, dtype=torch.float32) * (i + 1)) for i in range(n)]
    try:
        Target(name, f=f, tau=1.0, beta=0.5).rule(dummies, [])
    except InvalidSetting as error:
        return str(error)
    return None
