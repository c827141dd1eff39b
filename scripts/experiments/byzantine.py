"""Byzantine attacks against robust aggregators in DiLoCo with a shared model (one process).

Sixteen learners train a tiny byte LM on their own shards of ``builtin:pydoc``. Each round the
honest learners' pseudo-gradients (real inner AdamW phases, ``protocols.diloco.DilocoReplica``)
and f Byzantine ones go through a robust aggregator (``protocols.robust``) in place of DiLoCo's
mean, then the outer Nesterov step updates the shared x. Reports the final held-out loss of every
(aggregator, attack, f) against the same aggregator without attackers. Writes
``scripts/experiments/results/byzantine[_quick].{json,md}``::

    .venv/bin/python scripts/experiments/byzantine.py [--quick] [--fs 1,3,7] [--attacks ...]
        [--aggregators ...] [--beta 0.5] [--name byzantine] [--device cpu]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch
from _common import TextTask, markdown_table, model_config, set_up, write_results

from gossamer.protocols import attacks
from gossamer.protocols.diloco import DilocoConfig, DilocoReplica, Params
from gossamer.protocols.errors import InvalidSetting, NotEnoughUpdates, ProtocolError
from gossamer.protocols.models import build_model, next_byte_loss
from gossamer.protocols.robust import (
    AggregateResult,
    Contribution,
    WorkerMomentum,
    build_aggregator,
    centered_clipping_momentum,
    coordinate_median,
    flatten,
    sanitize,
    unflatten,
)

ATTACKS = ("sign_flip", "alie", "ipm", "gaussian", "random_direction", "stale", "nan_update", "huge_weight",
           "label_flip")
AGGREGATORS = ("mean", "median", "trimmed_mean", "geometric_median", "krum", "centered_clipping", "cc_one_step",
               "cc_momentum")
"""The default grid. Also accepted: ``mean_weighted`` (trusts claimed weights) and ``<name>+wm``
(worker momentum kept by the aggregator in front of any aggregator but cc_momentum, which has it)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Model, training and attack strengths of one grid (every cell uses the same data streams)."""

    learners: int = 16
    d_model: int = 32
    n_layers: int = 1
    context: int = 32
    batch_size: int = 8
    inner_steps: int = 10
    rounds: int = 10
    inner_lr: float = 3e-3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    seed: int = 0
    tau: float = 0.0  # clipping radius; 0: calibrated from the first clean round (see calibrate_tau)
    beta: float = 0.5  # worker momentum; 0.9 (the library default) diverges here even without attackers
    # on top of DiLoCo's outer Nesterov momentum 0.9 (see EXPERIMENTS.md)
    sign_flip_scale: float = 10.0
    ipm_eps: float = 0.1
    noise_scale: float = 10.0  # gaussian / random_direction: norm = noise_scale x the honest norm
    stale_lag: int = 3


class Cohort:
    """The learners that train in one run. They start from one seed and apply the same aggregate
    every round, so their x stay identical: the shared model of DiLoCo."""

    def __init__(self, s: Settings, task: TextTask, device: torch.device, *, trainers: list[int],
                 flipped: frozenset[int]) -> None:
        config = model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context)
        dc = DilocoConfig(inner_steps=s.inner_steps, inner_lr=s.inner_lr, outer_lr=s.outer_lr,
                          outer_momentum=s.outer_momentum)
        self.replicas = {i: DilocoReplica(build_model(config, seed=s.seed, device=device), dc) for i in trainers}
        self.samplers = {i: task.sampler(i, batch_size=s.batch_size, context=s.context, seed=s.seed)
                         for i in trainers}
        self.flipped, self.device, self.task, self.context = flipped, device, task, s.context

    def pseudo_gradients(self) -> dict[int, Params]:
        """Every trainer's inner phase from x; flipped learners train on y -> 255 - y."""
        out = {}
        for i, replica in self.replicas.items():
            replica.begin_round()
            for _ in range(replica.config.inner_steps):
                x, y = self.samplers[i].sample(self.device)
                replica.inner_step(x, attacks.label_flip(y) if i in self.flipped else y, next_byte_loss)
            out[i] = replica.end_inner()
        return out

    def apply(self, aggregate: Params) -> None:
        for replica in self.replicas.values():
            replica.finish_round(replica.snapshot, aggregate)

    def heldout_loss(self) -> float:
        model = next(iter(self.replicas.values())).module
        return self.task.heldout_loss(model, context=self.context, device=self.device)


def sender(i: int) -> str:
    return f"learner{i:02d}"


# --- aggregation and attacks ------------------------------------------------------------------


class Aggregation:
    """One aggregation point of a run, with its state across rounds (previous aggregate, worker
    momenta). ``mean`` is configured with f = 0: it cannot be told about attackers."""

    def __init__(self, name: str, *, f: int, tau: float, beta: float) -> None:
        base = name.removesuffix("+wm")
        self.f, self.tau, self.beta, self.base = f, tau, beta, base
        self.momentum = WorkerMomentum() if name.endswith("+wm") and base != "cc_momentum" else None
        self.center: torch.Tensor | None = None
        bound = {"mean": {}, "mean_weighted": {"trust_weights": True}, "centered_clipping": {"f": f, "tau": tau},
                 "cc_momentum": {"f": f, "tau": tau, "beta": beta}}
        if base not in AGGREGATORS and base != "mean_weighted":
            raise InvalidSetting(f"aggregator {name!r}: expected one of {AGGREGATORS}, mean_weighted, or <name>+wm")
        registry = {"mean_weighted": "mean", "cc_momentum": "centered_clipping_momentum"}
        self.fn = None if base == "cc_one_step" else build_aggregator(registry.get(base, base), **bound.get(base, {"f": f}))

    def __call__(self, contributions: list[Contribution]) -> AggregateResult:
        failures: tuple = ()
        if self.momentum is not None:  # momentum only over sanitized vectors, as WorkerMomentum asks
            usable, failures = sanitize(contributions, expected_numel=contributions[0].vector.numel(), max_norm=None)
            contributions = self.momentum.apply(usable, beta=self.beta)
        if self.fn is not None:
            return self.fn(contributions, failures)
        result = centered_clipping_momentum(contributions, failures, f=self.f, center=self.center, tau=self.tau)
        self.center = result.value
        return result


def refusal(name: str, *, f: int, n: int) -> str | None:
    """Why ``name`` refuses f Byzantine of n (InvalidSetting on a full round of dummies), or None."""
    dummies = [Contribution(sender(i), torch.arange(4, dtype=torch.float32) * (i + 1)) for i in range(n)]
    try:
        Aggregation(name, f=f, tau=1.0, beta=0.9)(dummies)
    except InvalidSetting as error:
        return str(error)
    return None


def byzantine_contributions(attack: str, s: Settings, *, f: int, history: list[dict[int, torch.Tensor]],
                            own: dict[int, torch.Tensor], first: int,
                            generator: torch.Generator) -> list[Contribution]:
    """What Byzantine learners first .. first + f - 1 send. Model-level attackers do not train:
    attacker k's "own" honest vector is honest learner k's (mod the honest count) of this round."""
    honest = [history[-1][i] for i in sorted(history[-1])]
    out = []
    for k in range(f):
        index, v = first + k, honest[k % len(honest)]
        if attack == "huge_weight":  # a reversed update that claims weight 1e9
            out.append(attacks.huge_weight(Contribution(sender(index), attacks.sign_flip(v, 1.0))))
            continue
        out.append(Contribution(sender(index), _attack_vector(attack, s, f=f, k=k, v=v, honest=honest,
                                                              history=history, own=own.get(index),
                                                              generator=generator)))
    return out


def _attack_vector(attack: str, s: Settings, *, f: int, k: int, v: torch.Tensor, honest: list[torch.Tensor],
                   history: list[dict[int, torch.Tensor]], own: torch.Tensor | None,
                   generator: torch.Generator) -> torch.Tensor:
    if attack == "sign_flip":
        return attacks.sign_flip(v, s.sign_flip_scale)
    if attack == "alie":
        return attacks.alie(honest, num_byzantine=f)
    if attack == "ipm":
        return attacks.ipm(honest, eps=s.ipm_eps)
    if attack == "gaussian":
        sigma = s.noise_scale * float(torch.linalg.vector_norm(v)) / math.sqrt(v.numel())
        return attacks.gaussian(v, sigma, generator)
    if attack == "random_direction":
        return attacks.random_direction(v, s.noise_scale, generator)
    if attack == "stale":
        mine = [round_vectors[sorted(round_vectors)[k % len(round_vectors)]] for round_vectors in history]
        return attacks.stale(mine, min(s.stale_lag, len(mine) - 1))
    if attack == "nan_update":
        return attacks.nan_update(v)
    if attack == "label_flip":
        assert own is not None, "label-flip attackers train"
        return own
    raise InvalidSetting(f"attack {attack!r}: expected one of {ATTACKS}")


def run_cell(aggregator: str, attack: str | None, f: int, s: Settings, task: TextTask,
             device: torch.device) -> dict:
    """One run: f Byzantine learners (the last f indices) with ``attack``; None = no attack, all
    ``s.learners`` honest, the aggregator still configured for f."""
    n, honest_count = s.learners, s.learners - (f if attack else 0)
    honest = list(range(honest_count))
    flipped = frozenset(range(honest_count, n)) if attack == "label_flip" else frozenset()
    cohort = Cohort(s, task, device, trainers=honest + sorted(flipped), flipped=flipped)
    aggregation = Aggregation(aggregator, f=f, tau=s.tau, beta=s.beta)
    generator = torch.Generator(device=device).manual_seed(s.seed)
    history: list[dict[int, torch.Tensor]] = []
    skipped, byzantine_used = 0, []
    for _ in range(s.rounds):
        try:
            ds = cohort.pseudo_gradients()
        except ProtocolError as error:  # a non-finite inner loss: the shared model blew up
            return {"outcome": "diverged", "detail": str(error), "skipped_rounds": skipped}
        vectors = {i: flatten(d) for i, d in ds.items()}
        history.append({i: vectors[i] for i in honest})
        contributions = [Contribution(sender(i), vectors[i]) for i in honest]
        if attack:
            contributions += byzantine_contributions(attack, s, f=f, history=history, own=vectors,
                                                     first=honest_count, generator=generator)
        like = ds[honest[0]]
        try:
            result = aggregation(contributions)
        except NotEnoughUpdates:  # the round is skipped: a zero update
            skipped += 1
            cohort.apply({name: torch.zeros_like(t) for name, t in like.items()})
            continue
        byzantine_used.append(sum(int(u.removeprefix("learner")) >= honest_count for u in result.used))
        cohort.apply(unflatten(result.value, like))
    loss = cohort.heldout_loss()
    outcome = "ok" if math.isfinite(loss) else "diverged"
    return {"outcome": outcome, "loss": loss, "skipped_rounds": skipped, "byzantine_used": byzantine_used}


def calibrate_tau(s: Settings, task: TextTask, device: torch.device) -> float:
    """Median distance of the honest round-0 pseudo-gradients to their coordinate-wise median:
    the spread of honest updates, in their own units (what the clipping radius should be near)."""
    cohort = Cohort(s, task, device, trainers=list(range(s.learners)), flipped=frozenset())
    vectors = [flatten(d) for d in cohort.pseudo_gradients().values()]
    center = coordinate_median([Contribution(sender(i), v) for i, v in enumerate(vectors)]).value
    return float(torch.stack([torch.linalg.vector_norm(v - center) for v in vectors]).median())


def run_grid(s: Settings, task: TextTask, device: torch.device, *, aggregators: list[str], attacks: list[str],
             fs: list[int]) -> dict:
    """Every (aggregator, f, attack) cell plus the clean runs; refused settings are not run."""
    cells: dict[str, dict] = {}
    cleans: dict[tuple[str, int], dict] = {}  # only trimmed mean and Krum compute with f; the rest check it
    for aggregator in aggregators:
        for f in fs:
            reason = refusal(aggregator, f=f, n=s.learners)
            start = time.perf_counter()
            key = (aggregator, f if aggregator.removesuffix("+wm") in ("trimmed_mean", "krum") else -1)
            if reason:
                clean = {"outcome": "refused", "detail": reason}
            elif key not in cleans:
                clean = cleans[key] = run_cell(aggregator, None, f, s, task, device)
            else:
                clean = cleans[key]
            cells[f"{aggregator}|{f}|clean"] = clean
            for attack in attacks:
                cell = dict(clean) if reason else run_cell(aggregator, attack, f, s, task, device)
                cells[f"{aggregator}|{f}|{attack}"] = cell
            print(f"{aggregator} f={f}: clean {clean.get('loss', clean['outcome'])} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    return cells


def seed_spread(s: Settings, task: TextTask, device: torch.device, *, aggregators: list[str], f: int,
                seeds: int) -> dict[str, list[float]]:
    """Clean final losses for seeds 0..seeds (init and data order): how far apart two clean runs
    land, the noise floor for reading the cells (same tau, aggregator configured for f)."""
    out = {}
    for aggregator in aggregators:
        if refusal(aggregator, f=f, n=s.learners) is None:
            out[aggregator] = [run_cell(aggregator, None, f, replace(s, seed=seed), task, device).get("loss", math.nan)
                               for seed in range(seeds + 1)]
    return out


def _cell_text(cell: dict, clean: dict) -> str:
    if cell["outcome"] != "ok":
        return cell["outcome"]
    text = f"{cell['loss'] - clean['loss']:+.3f}" if clean["outcome"] == "ok" else f"{cell['loss']:.3f}"
    return text + (f" ({cell['skipped_rounds']} skipped)" if cell["skipped_rounds"] else "")


def render(cells: dict, s: Settings, *, aggregators: list[str], attacks: list[str], fs: list[int],
           initial_loss: float, spread: dict[str, list[float]]) -> str:
    parts = [f"Settings: {asdict(s)}",
             f"Held-out loss of the initial model: {initial_loss:.3f}. Cells: final held-out loss minus the "
             "same aggregator's clean run (same f, no attacker: all 16 learners honest); 'diverged' = "
             "non-finite loss; 'refused' = the aggregator refuses n=16 with this f; 'k skipped' = rounds "
             "the aggregator could not aggregate (NotEnoughUpdates), applied as a zero update."]
    for f in fs:
        clean_row = [_clean_text(cells[f"{a}|{f}|clean"]) for a in aggregators]
        rows = [["clean (absolute loss)", *clean_row]]
        rows += [[attack] + [_cell_text(cells[f"{a}|{f}|{attack}"], cells[f"{a}|{f}|clean"]) for a in aggregators]
                 for attack in attacks]
        parts += [f"f = {f} Byzantine of {s.learners}:", markdown_table(["attack", *aggregators], rows)]
    if spread:
        rows = [[name, *(f"{x:.3f}" for x in losses), f"{max(losses) - min(losses):.3f}"]
                for name, losses in spread.items()]
        seeds = len(next(iter(spread.values())))
        parts += [f"Noise floor: clean runs with seeds 0..{seeds - 1} (f = {fs[0]} configuration):",
                  markdown_table(["aggregator", *(f"seed {i}" for i in range(seeds)), "max - min"], rows)]
    return "\n\n".join(parts)


def _clean_text(cell: dict) -> str:
    return f"{cell['loss']:.3f}" if cell["outcome"] == "ok" else cell["outcome"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: f=3, 4 rounds, a few cells")
    parser.add_argument("--fs", default=None, help="comma-separated f values (default 1,3,7)")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--aggregators", default=",".join(AGGREGATORS))
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--beta", type=float, default=Settings.beta, help="worker momentum")
    parser.add_argument("--noise_seeds", type=int, default=None, help="extra clean seeds (default 2, quick 0)")
    parser.add_argument("--name", default=None, help="results file stem (default byzantine[_quick])")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N")
    args = parser.parse_args(argv)
    device = set_up(args.device)
    s = Settings(rounds=args.rounds or (4 if args.quick else 10), beta=args.beta)
    fs = [int(x) for x in (args.fs or ("3" if args.quick else "1,3,7")).split(",")]
    attacks, aggregators = args.attacks.split(","), args.aggregators.split(",")
    if sorted(set(attacks) - set(ATTACKS)):
        parser.error(f"--attacks: unknown {sorted(set(attacks) - set(ATTACKS))}; known: {list(ATTACKS)}")
    for name in aggregators:
        try:
            Aggregation(name, f=0, tau=1.0, beta=0.5)
        except InvalidSetting as error:
            parser.error(f"--aggregators: {error}")
    if args.quick:
        aggregators = [a for a in aggregators if a in ("mean", "krum", "cc_momentum")]
    task = TextTask.load(source="builtin:pydoc", learners=s.learners)
    s = replace(s, tau=s.tau or calibrate_tau(s, task, device))
    start = time.perf_counter()
    cells = run_grid(s, task, device, aggregators=aggregators, attacks=attacks, fs=fs)
    noise_seeds = args.noise_seeds if args.noise_seeds is not None else (0 if args.quick else 2)
    spread = seed_spread(s, task, device, aggregators=aggregators, f=fs[0], seeds=noise_seeds) if noise_seeds else {}
    initial = task.heldout_loss(build_model(model_config(d_model=s.d_model, n_layers=s.n_layers,
                                                         context=s.context), seed=s.seed, device=device),
                                context=s.context, device=device)
    markdown = render(cells, s, aggregators=aggregators, attacks=attacks, fs=fs, initial_loss=initial, spread=spread)
    print(markdown)
    name = args.name or ("byzantine_quick" if args.quick else "byzantine")
    write_results(name, {"settings": asdict(s), "initial_loss": initial, "fs": fs, "attacks": attacks,
                         "aggregators": aggregators, "run_s": time.perf_counter() - start, "cells": cells,
                         "clean_seed_losses": spread}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
