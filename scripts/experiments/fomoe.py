"""FoMoE partial-expert replicas (r = 2, r = 1) against full-replica DiLoCo and the bytes of data
parallel, on a tiny MoE byte LM, four non-IID workers in one process (docs/EXPERIMENTS.md)::

    nice -n 10 .venv/bin/python scripts/experiments/fomoe.py [--quick] [--rounds 24] [--inner_steps 25] [--seed 0]"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from _common import RESULTS_DIR, TextTask, set_up

from gossamer.protocols.core.models import load_parameters, next_byte_loss
from gossamer.protocols.diloco.core.mixing import MixingPlan
from gossamer.protocols.diloco.core.mixing import simulate_round as simulate_diloco_round
from gossamer.protocols.diloco.core.replica import DilocoConfig, DilocoReplica
from gossamer.protocols.fomoe.core import (
    FomoeConfig,
    FomoeReplica,
    MoEConfig,
    MoETransformer,
    ParamLayout,
    build_moe_model,
    data_parallel_bytes,
    global_parameters,
    place_experts,
    simulate_round,
    sync_bytes,
)
from gossamer_harness.report import figure, machine, markdown_table, write_result

WORKERS = tuple(f"worker{i}" for i in range(4))
ARMS = {"diloco": ("full-replica DiLoCo (8 of 8 experts each)", None),
        "fomoe_r2": ("FoMoE r = 2 (4 of 8 experts each)", 2),
        "fomoe_r1": ("FoMoE r = 1 (2 of 8 experts each)", 1)}


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything a run depends on (reported with the results)."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_experts: int = 8
    top_k: int = 2
    mlp_ratio: int = 2  # expert hidden width 256: top-2 runs as much MLP as one dense MLP of ratio 4
    context: int = 64
    batch_size: int = 16
    inner_steps: int = 25
    rounds: int = 24
    inner_lr: float = 2e-3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    aux_loss_weight: float = 0.01
    probe_windows: int = 32
    seed: int = 0

    def model(self) -> MoEConfig:
        return MoEConfig(d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, context=self.context,
                         mlp_ratio=self.mlp_ratio, n_experts=self.n_experts, top_k=self.top_k)

    def diloco(self) -> DilocoConfig:
        return DilocoConfig(inner_steps=self.inner_steps, inner_lr=self.inner_lr, outer_lr=self.outer_lr,
                            outer_momentum=self.outer_momentum)


class Observer:
    """The swarm's model after each round: held-out loss, top-1 routing on the probe, bytes."""

    def __init__(self, s: Settings, task: TextTask, device: torch.device) -> None:
        self.s, self.task, self.device = s, task, device
        self.model = build_moe_model(s.model(), seed=s.seed, device=device)
        starts = torch.arange(s.probe_windows) * (task.heldout.numel() - s.context - 1) // s.probe_windows
        self.probe = task.heldout[starts[:, None] + torch.arange(s.context)].to(device=device, dtype=torch.long)
        self.rows: list[dict] = []
        self._top1: torch.Tensor | None = None

    @torch.no_grad()
    def record(self, params: dict[str, torch.Tensor], *, round: int, bytes_so_far: int, **extra: float) -> None:
        load_parameters(self.model, params)
        loss = self.task.heldout_loss(self.model, context=self.s.context, device=self.device)
        self.model.eval()
        top1 = self.model.forward_routed(self.probe)[1].top1
        agreement = None if self._top1 is None else float((top1 == self._top1).float().mean())
        share = torch.bincount(top1.flatten(), minlength=self.s.n_experts).max() / top1.numel()
        self._top1 = top1
        self.rows.append({"round": round, "steps": round * self.s.inner_steps, "heldout_loss": loss,
                          "top1_agreement": agreement, "busiest_expert_share": float(share),
                          "bytes": bytes_so_far, **extra})


def loss_with_aux(x: torch.Tensor, y: torch.Tensor, weight: float) -> Callable[[MoETransformer], torch.Tensor]:
    def compute(module: MoETransformer) -> torch.Tensor:
        logits, routing = module.forward_routed(x)
        return next_byte_loss(logits, y) + weight * routing.aux_loss
    return compute


def run_diloco(s: Settings, task: TextTask, device: torch.device, observer: Observer) -> None:
    replicas = [DilocoReplica(build_moe_model(s.model(), seed=s.seed, device=device), s.diloco()) for _ in WORKERS]
    samplers = [task.sampler(i, batch_size=s.batch_size, context=s.context, seed=s.seed) for i in range(len(WORKERS))]
    layout = ParamLayout.of(replicas[0].module)
    per_round = sync_bytes(layout, place_experts(WORKERS, n_experts=s.n_experts, replication=len(WORKERS),
                                                 round=0))
    observer.record(replicas[0].parameters_snapshot(), round=0, bytes_so_far=0)
    for t in range(s.rounds):
        start = time.perf_counter()
        losses = simulate_diloco_round(
            replicas, lambda i, _r, _k: loss_with_aux(*samplers[i].sample(device), s.aux_loss_weight),
            MixingPlan(), round=t, seed=s.seed)
        step_s = (time.perf_counter() - start) / (len(WORKERS) * s.inner_steps)
        observer.record(replicas[0].parameters_snapshot(), round=t + 1,
                        bytes_so_far=(t + 1) * (per_round.up_bytes + per_round.down_bytes),
                        train_loss=sum(losses) / len(losses), skip_fraction=0.0, step_s=step_s)


def run_fomoe(s: Settings, replication: int, task: TextTask, device: torch.device, observer: Observer) -> None:
    placement = place_experts(WORKERS, n_experts=s.n_experts, replication=replication, round=0, seed=s.seed)
    fomoe = FomoeConfig(replication=replication, aux_loss_weight=s.aux_loss_weight)
    replicas = [FomoeReplica(w, build_moe_model(s.model(), seed=s.seed, device=device), placement.resident(w),
                             diloco=s.diloco(), fomoe=fomoe) for w in WORKERS]
    samplers = [task.sampler(i, batch_size=s.batch_size, context=s.context, seed=s.seed) for i in range(len(WORKERS))]
    observer.record(global_parameters(replicas, placement), round=0, bytes_so_far=0)
    moved = 0
    for t in range(s.rounds):
        start = time.perf_counter()
        report = simulate_round(replicas, placement, lambda i, _r, _k: samplers[i].sample(device))
        step_s = (time.perf_counter() - start) / (len(WORKERS) * s.inner_steps)
        formula = sync_bytes(replicas[0].layout, placement, idle=report.idle)
        assert (report.up_bytes, report.down_bytes) == (formula.up_bytes, formula.down_bytes)
        moved += report.up_bytes + report.down_bytes + report.counts_bytes
        steps = [step for worker in report.steps for step in worker]
        observer.record(global_parameters(replicas, placement), round=t + 1, bytes_so_far=moved,
                        train_loss=sum(x.loss for x in steps) / len(steps),
                        skip_fraction=sum(x.skip_fraction for x in steps) / len(steps), step_s=step_s,
                        idle_units=len(report.idle))


def unigram_loss(task: TextTask) -> float:
    """Held-out cross-entropy (nats/byte) of the training bytes' unigram frequencies (add-one)."""
    counts = torch.ones(256, dtype=torch.float64)
    for piece in task.shards:
        counts += torch.bincount(piece.long(), minlength=256).double()
    logp = (counts / counts.sum()).log()
    return float(-logp[task.heldout.long()].mean())


def summarise(key: str, rows: list[dict], s: Settings, ddp_bytes: int, diloco_bytes: int | None) -> dict:
    label, replication = ARMS[key]
    resident = s.n_experts if replication is None else s.n_experts * replication // len(WORKERS)
    trained = rows[1:]
    agreements = [r["top1_agreement"] for r in trained[len(trained) // 2:]]  # the second half of training
    final = rows[-1]
    return {"label": label, "resident": resident, "final_loss": final["heldout_loss"], "bytes": final["bytes"],
            "x_below_ddp": ddp_bytes / final["bytes"],
            "x_below_diloco": None if diloco_bytes is None else diloco_bytes / final["bytes"],
            "skip_fraction": sum(r["skip_fraction"] for r in trained) / len(trained),
            "expected_skip": 1 - resident / s.n_experts,
            "step_ms": 1e3 * sorted(r["step_s"] for r in trained)[len(trained) // 2],
            "agreement_min": min(agreements), "agreement_mean": sum(agreements) / len(agreements),
            "busiest_share_max": max(r["busiest_expert_share"] for r in trained), "rows": rows}


def render(results: dict, s: Settings, ddp_bytes: int, baseline: float, layout: ParamLayout) -> str:
    base = results.get("diloco")
    headers = ["arm", "held-out loss", "gap vs full DiLoCo", "MB moved", "x below DDP", "x below full DiLoCo",
               "skip fraction (expected)", "ms / inner step", "top-1 agreement, 2nd half: min / mean",
               "busiest expert share (max)"]
    rows = [[r["label"], f"{r['final_loss']:.4f}",
             "" if base is None or k == "diloco" else f"{r['final_loss'] - base['final_loss']:+.4f}",
             f"{r['bytes'] / 1e6:.1f}", f"{r['x_below_ddp']:.1f}x",
             "" if r["x_below_diloco"] is None or k == "diloco" else f"{r['x_below_diloco']:.2f}x",
             f"{r['skip_fraction']:.3f} ({r['expected_skip']:.3f})", f"{r['step_ms']:.0f}",
             f"{r['agreement_min']:.3f} / {r['agreement_mean']:.3f}", f"{r['busiest_share_max']:.3f}"]
            for k, r in results.items()]
    rows.append(["synchronous data parallel (bytes only)", "", "", f"{ddp_bytes / 1e6:.1f}", "1.0x", "", "", "", "",
                 ""])
    shown = sorted({*range(0, s.rounds + 1, max(1, s.rounds // 8)), s.rounds})
    curve = markdown_table(["arm"] + [f"round {t}" for t in shown],
                           [[r["label"]] + [f"{r['rows'][t]['heldout_loss']:.3f}" for t in shown]
                            for r in results.values()])
    return "\n\n".join([
        f"Settings: {asdict(s)}; load average at the end {os.getloadavg()[0]:.1f}",
        f"Model: {sum(layout.size_bytes.values()) / 4e6:.2f}M float32 parameters; dense (embeddings, attention, "
        f"norms, routers) {layout.dense_bytes / 1e6:.2f} MB, each expert over all blocks "
        f"{layout.expert_bytes(0) / 1e6:.2f} MB. Trivial baselines: uniform ln 256 = {math.log(256):.3f}, "
        f"unigram {baseline:.3f} nats/byte.",
        markdown_table(headers, rows), "Held-out loss of the swarm's model by round:", curve])


def plot(result: dict, path: Path) -> None:
    """Held-out loss against the bytes moved and against the inner steps, one line per arm."""
    with figure(path, ncols=2, figsize=(11, 4), dpi=120) as (_, (by_bytes, by_steps)):
        for r in result["arms"].values():
            rows = r["rows"][1:]
            by_bytes.plot([x["bytes"] / 1e6 for x in rows], [x["heldout_loss"] for x in rows], marker=".",
                          label=r["label"])
            by_steps.plot([x["steps"] for x in r["rows"]], [x["heldout_loss"] for x in r["rows"]], label=r["label"])
        by_bytes.axvline(result["ddp_bytes"] / 1e6, color="grey", linestyle="--", label="data parallel, same steps")
        by_bytes.set(xscale="log", xlabel="MB moved (all workers, up + down)", ylabel="held-out loss (nats/byte)")
        by_steps.set(xlabel="inner steps per worker", ylabel="held-out loss (nats/byte)")
        by_bytes.legend(fontsize=8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 rounds of 5 inner steps")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--inner_steps", type=int)
    parser.add_argument("--seed", type=int, default=0, help="model init, data order and placement")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    args = parser.parse_args(argv)
    before = machine()
    device = set_up(args.device)
    s = Settings(rounds=args.rounds or (4 if args.quick else Settings.rounds),
                 inner_steps=args.inner_steps or (5 if args.quick else Settings.inner_steps), seed=args.seed)
    task = TextTask.load(source="builtin:pydoc", learners=len(WORKERS))
    layout = ParamLayout.of(build_moe_model(s.model(), seed=0))
    ddp = data_parallel_bytes(layout, num_peers=len(WORKERS), steps=s.rounds * s.inner_steps)
    ddp_bytes = ddp.up_bytes + ddp.down_bytes
    results: dict[str, dict] = {}
    for key, (label, replication) in ARMS.items():
        start = time.perf_counter()
        observer = Observer(s, task, device)
        if replication is None:
            run_diloco(s, task, device, observer)
        else:
            run_fomoe(s, replication, task, device, observer)
        diloco_bytes = results["diloco"]["bytes"] if "diloco" in results else None
        results[key] = summarise(key, observer.rows, s, ddp_bytes, diloco_bytes)
        print(f"{label}: final {results[key]['final_loss']:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    markdown = render(results, s, ddp_bytes, unigram_loss(task), layout)
    print(markdown)
    name = "fomoe" + ("_quick" if args.quick else "") + (f"_seed{s.seed}" if s.seed else "")
    result = write_result(RESULTS_DIR / f"{name}.json", {"settings": asdict(s), "ddp_bytes": ddp_bytes,
                                                        "unigram_loss": unigram_loss(task), "arms": results},
                          before=before, markdown=markdown, indent=1)
    plot(result, RESULTS_DIR / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
