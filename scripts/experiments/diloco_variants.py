"""Gossip DiLoCo variants against data parallel and DiLoCo on a tiny byte LM (one process).

Eight learners, each with its own shard of ``builtin:pydoc``, run through the committed protocol
code (``protocols.mixing.simulate_round``). Per arm: held-out loss per round (mean and spread over
the replicas, largest round-to-round rise), bytes each learner sends per round, and compute
utilisation on an emulated link, measured for the tiny model and modelled for a 150M model
(see ``_cost_rows``). Writes ``scripts/experiments/results/diloco_variants[_quick].{json,md}``::

    .venv/bin/python scripts/experiments/diloco_variants.py [--quick] [--rounds 20] [--inner_steps 30]
        [--arms dp,diloco,...] [--seed 0] [--device cpu]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import asdict, dataclass

import torch
from _common import (
    TextTask,
    markdown_table,
    median_time_s,
    model_config,
    param_bytes,
    set_up,
    write_results,
)

from gossamer.protocols.diloco import DilocoConfig, DilocoReplica
from gossamer.protocols.mixing import MixingPlan, mixing_weights, simulate_round
from gossamer.protocols.models import ByteTransformer, build_model, next_byte_loss, parameter_groups

RTT_S = 0.1
LINKS_MBIT = (100, 300)
MODELLED_STEP_S = 0.5
MODELLED_CONFIG = {"d_model": 1024, "n_layers": 12, "n_heads": 16, "context": 1024}
MODELLED_H = 500


@dataclass(frozen=True, kw_only=True)
class Settings:
    """One run of the experiment (every arm uses the same data stream and initial model)."""

    learners: int = 8
    d_model: int = 64
    n_layers: int = 2
    context: int = 64
    batch_size: int = 16
    inner_steps: int = 30
    rounds: int = 20
    inner_lr: float = 1e-3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    seed: int = 0


@dataclass(frozen=True)
class Arm:
    """One variant: W1/W2 topologies (None: data parallel), W2 on the subset, shared momentum."""

    key: str
    label: str
    w1: str | None = None
    w2: str | None = None
    w2_on_subset: bool = False
    shared_momentum: bool = False
    extra: bool = False  # not among the brief's arms (a)-(e)

    def plan(self, subset: tuple[str, ...]) -> MixingPlan:
        assert self.w1 is not None and self.w2 is not None
        return MixingPlan(w1=self.w1, w2=self.w2, w2_subset=subset if self.w2_on_subset else "all")


ARMS = (
    Arm("dp", "(a) data parallel, all-reduce every step"),
    Arm("diloco", "(b) DiLoCo (W1 = W2 = global)", "global", "global"),
    Arm("gossip_global_none", "(c) gossip W1 global, no W2", "global", "none"),
    Arm("gossip_global_ring_subset", "(d) gossip W1 global, W2 ring on subset", "global", "ring", True),
    Arm("diloco_shared_momentum", "(e) DiLoCo + shared outer momentum", "global", "global", shared_momentum=True),
    Arm("gossip_global_none_shared_momentum", "(f) gossip W1 global, no W2, shared momentum",
        "global", "none", shared_momentum=True, extra=True),
    Arm("gossip_ring_ring_subset", "(g) gossip W1 ring, W2 ring on subset", "ring", "ring", True, extra=True),
)


def w2_subset(model: ByteTransformer) -> tuple[str, ...]:
    """Embeddings + the first layer + the final norm (and the head when untied)."""
    groups = parameter_groups(model)
    return tuple(groups["embeddings"] + groups["layer0"] + groups["head"])


# --- training -----------------------------------------------------------------------------------


def _diloco_config(s: Settings) -> DilocoConfig:
    return DilocoConfig(inner_steps=s.inner_steps, inner_lr=s.inner_lr, outer_lr=s.outer_lr,
                        outer_momentum=s.outer_momentum)


def run_protocol_arm(arm: Arm, s: Settings, task: TextTask, device: torch.device) -> list[list[float]]:
    """Held-out loss of every replica after every round, through ``simulate_round``."""
    config = model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context)
    replicas = [DilocoReplica(build_model(config, seed=s.seed, device=device), _diloco_config(s))
                for _ in range(s.learners)]
    samplers = [task.sampler(i, batch_size=s.batch_size, context=s.context, seed=s.seed) for i in range(s.learners)]
    plan = arm.plan(w2_subset(replicas[0].module))
    curves = []
    for round_index in range(s.rounds):
        simulate_round(replicas, lambda i, _r, _k: samplers[i].sample(device), plan, round=round_index,
                       seed=s.seed, shared_momentum=arm.shared_momentum, loss_fn=next_byte_loss)
        curves.append([task.heldout_loss(r.module, context=s.context, device=device) for r in replicas])
    return curves


def run_data_parallel(s: Settings, task: TextTask, device: torch.device) -> list[list[float]]:
    """One AdamW step per inner step on the mean of the learners' gradients (their batches
    concatenated: equal batch sizes make the mean loss the mean of per-learner losses)."""
    config = model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context)
    model = build_model(config, seed=s.seed, device=device)
    dc = _diloco_config(s)
    optimizer = torch.optim.AdamW(model.parameters(), lr=dc.inner_lr, betas=dc.inner_betas,
                                  weight_decay=dc.inner_weight_decay)
    samplers = [task.sampler(i, batch_size=s.batch_size, context=s.context, seed=s.seed) for i in range(s.learners)]
    curves = []
    for _ in range(s.rounds):
        for _ in range(s.inner_steps):
            xs, ys = zip(*(sampler.sample(device) for sampler in samplers), strict=True)
            optimizer.zero_grad(set_to_none=True)
            next_byte_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), dc.grad_clip)
            optimizer.step()
        curves.append([task.heldout_loss(model, context=s.context, device=device)])
    return curves


def measure_step_s(s: Settings, task: TextTask, device: torch.device) -> float:
    """Median seconds of one learner's inner step (batch_size windows) on this machine."""
    config = model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context)
    replica = DilocoReplica(build_model(config, seed=s.seed, device=device), _diloco_config(s))
    sampler = task.sampler(0, batch_size=s.batch_size, context=s.context, seed=s.seed + 1)
    replica.begin_round()
    return median_time_s(lambda: replica.inner_step(*sampler.sample(device), next_byte_loss),
                         warmup=5, repeats=40, device=device)


# --- communication cost -------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One transfer a learner makes: bytes on its uplink, blocking or overlapped, times per round."""

    what: str
    size_bytes: float
    blocking: bool
    per_round: int = 1


def _degree(kind: str, n: int) -> int:
    """Neighbours a learner sends to (nonzero off-diagonal entries of its column of W)."""
    w = mixing_weights(kind, n, round=0, seed=0)
    return int((w[:, 0] > 0).sum()) - int(w[0, 0] > 0)


def exchanges(arm: Arm, *, n: int, full_bytes: int, subset_bytes: int, inner_steps: int) -> list[Exchange]:
    """What each learner of ``arm`` sends per round. A global mix of pseudo-gradients (or of the
    momentum) is a ring all-reduce, 2(n-1)/n x bytes; a gossip mix sends k x bytes to k neighbours.
    DiLoCo's W1 sends nothing: its replicas are identical after every round, so m = x."""
    allreduce = 2 * (n - 1) / n
    if arm.w1 is None:
        return [Exchange("gradient all-reduce", allreduce * full_bytes, True, inner_steps)]
    out = []
    if not (arm.w1 == "global" and arm.w2 == "global"):
        out.append(Exchange(f"W1 {arm.w1} params", _degree(arm.w1, n) * full_bytes, False))
    w2_bytes = subset_bytes if arm.w2_on_subset else full_bytes
    if arm.w2 == "global":
        out.append(Exchange("pseudo-gradient all-reduce", allreduce * w2_bytes, True))
    elif arm.w2 != "none":
        out.append(Exchange(f"W2 {arm.w2} pseudo-gradients", _degree(arm.w2, n) * w2_bytes, True))
    if arm.shared_momentum:
        out.append(Exchange("momentum all-reduce", allreduce * full_bytes, True))
    return out


def utilisation(ex: list[Exchange], *, step_s: float, inner_steps: int, link_mbit: float) -> float:
    """compute / wall for one round: overlapped sends hide behind the inner phase, blocking ones
    (each with one RTT) add to it."""
    def seconds(e: Exchange) -> float:
        return e.per_round * (RTT_S + 8 * e.size_bytes / (link_mbit * 1e6))

    compute_s = inner_steps * step_s
    overlapped_s = sum(seconds(e) for e in ex if not e.blocking)
    blocking_s = sum(seconds(e) for e in ex if e.blocking)
    return compute_s / (max(compute_s, overlapped_s) + blocking_s)


def _sizes(model: torch.nn.Module) -> tuple[int, int]:
    subset = set(w2_subset(model))
    named = list(model.named_parameters())
    return param_bytes(named), param_bytes(named, lambda name: name in subset)


def modelled_sizes() -> tuple[int, int, int]:
    """(params, full bytes, subset bytes) of the 150M-class model, built on the meta device."""
    with torch.device("meta"):
        model = ByteTransformer(model_config(**MODELLED_CONFIG))
    full, subset = _sizes(model)
    return sum(p.numel() for p in model.parameters()), full, subset


def _cost_rows(arm: Arm, s: Settings, step_s: float, tiny: tuple[int, int], big: tuple[int, int]) -> dict:
    """Bytes per round and utilisation: measured (tiny model, measured step), modelled (150M model,
    0.5 s per inner step, at this run's H and at H = 500)."""
    cases = {"measured": (tiny, step_s, s.inner_steps), "modelled_H": (big, MODELLED_STEP_S, s.inner_steps),
             "modelled_H500": (big, MODELLED_STEP_S, MODELLED_H)}
    out = {}
    for case, ((full, subset), step, h) in cases.items():
        ex = exchanges(arm, n=s.learners, full_bytes=full, subset_bytes=subset, inner_steps=h)
        out[case] = {"bytes_per_round": sum(e.size_bytes * e.per_round for e in ex),
                     "exchanges": [asdict(e) for e in ex],
                     **{f"util_{m}mbit": utilisation(ex, step_s=step, inner_steps=h, link_mbit=m) for m in LINKS_MBIT}}
    return out


# --- report -------------------------------------------------------------------------------------


def summarise(curves: list[list[float]]) -> dict:
    means = [sum(row) / len(row) for row in curves]
    rises = [b - a for a, b in itertools.pairwise(means)]
    return {"final_mean": means[-1], "final_spread": max(curves[-1]) - min(curves[-1]),
            "max_rise": max([0.0, *rises]), "mean_curve": means, "per_replica": curves}


def render(results: dict, s: Settings, step_s: float, big_params: int) -> str:
    quality = markdown_table(
        ["arm", "final held-out loss (mean of replicas)", "spread (max-min)", "max round-to-round rise",
         "KB sent / round / learner"],
        [[r["label"], f"{r['final_mean']:.4f}", f"{r['final_spread']:.4f}", f"{r['max_rise']:.4f}",
          f"{r['cost']['measured']['bytes_per_round'] / 1e3:.1f}"] for r in results.values()])
    util_headers = ["arm"] + [f"{case} {m} Mbit/s" for case in ("measured", f"modelled H={s.inner_steps}",
                                                              f"modelled H={MODELLED_H}") for m in LINKS_MBIT]
    util_rows = [[r["label"]] + [f"{100 * r['cost'][c][f'util_{m}mbit']:.1f}%" for c in
                                 ("measured", "modelled_H", "modelled_H500") for m in LINKS_MBIT]
                 for r in results.values()]
    curves = markdown_table(["arm"] + [str(t + 1) for t in range(s.rounds)],
                            [[r["label"]] + [f"{v:.3f}" for v in r["mean_curve"]] for r in results.values()])
    return "\n\n".join([
        f"Settings: {asdict(s)}",
        "Held-out loss (nats/byte) after the last round, and traffic of the tiny model:", quality,
        f"Compute utilisation (compute / wall), RTT {RTT_S * 1000:.0f} ms per blocking exchange. measured: "
        f"tiny model, measured inner step {1000 * step_s:.1f} ms. modelled: {big_params / 1e6:.0f}M-parameter "
        f"ByteTransformer {MODELLED_CONFIG}, fp32, ASSUMED inner step {MODELLED_STEP_S} s:",
        markdown_table(util_headers, util_rows),
        "Held-out loss (mean of replicas) per round:", curves])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 6 rounds of 10 inner steps")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--inner_steps", type=int)
    parser.add_argument("--arms", default=",".join(a.key for a in ARMS))
    parser.add_argument("--seed", type=int, default=0, help="model init and data order")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.arms.split(",")) - {a.key for a in ARMS})
    if unknown:
        parser.error(f"--arms: unknown {unknown}; known: {[a.key for a in ARMS]}")
    device = set_up(args.device)
    s = Settings(rounds=args.rounds or (6 if args.quick else 20),
                 inner_steps=args.inner_steps or (10 if args.quick else 30), seed=args.seed)
    task = TextTask.load(source="builtin:pydoc", learners=s.learners)
    step_s = measure_step_s(s, task, device)
    tiny = _sizes(build_model(model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context), seed=0))
    big_params, *big = modelled_sizes()
    results = {}
    for arm in (a for a in ARMS if a.key in args.arms.split(",")):
        start = time.perf_counter()
        curves = run_data_parallel(s, task, device) if arm.w1 is None else run_protocol_arm(arm, s, task, device)
        results[arm.key] = {"label": arm.label, "extra": arm.extra, **summarise(curves),
                            "cost": _cost_rows(arm, s, step_s, tiny, tuple(big)),
                            "run_s": time.perf_counter() - start}
        print(f"{arm.label}: final {results[arm.key]['final_mean']:.4f} ({results[arm.key]['run_s']:.0f} s)",
              flush=True)
    markdown = render(results, s, step_s, big_params)
    print(markdown)
    name = "diloco_variants" + ("_quick" if args.quick else "") + (f"_seed{s.seed}" if s.seed else "")
    write_results(name, {"settings": asdict(s), "step_s": step_s, "rtt_s": RTT_S, "modelled_step_s": MODELLED_STEP_S,
                         "modelled_config": MODELLED_CONFIG, "modelled_params": big_params, "arms": results}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
