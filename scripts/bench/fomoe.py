"""FoMoE local step time at r = 1 and r = 2 against the full replica, and sync bytes per round
(method and results: docs/BENCHMARKS.md, "FoMoE")::

    nice -n 10 .venv/bin/python scripts/bench/fomoe.py [--repeats 15] [--steps_per_rep 2]
        [--inner_steps 25] [--device auto] [--json scripts/bench/results/fomoe.json]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from gossamer.protocols.core.models import BatchSampler, load_text, next_byte_loss, split_text
from gossamer.protocols.diloco.core.replica import DilocoConfig
from gossamer.protocols.fomoe.core import (
    FomoeReplica,
    MoEConfig,
    build_moe_model,
    place_experts,
    simulate_round,
    sync_bytes,
    update_bytes,
)
from gossamer_harness.report import MB, machine, markdown_table, write_result

_HERE = Path(__file__).resolve().parent
CONFIG = MoEConfig(d_model=128, n_layers=4, n_heads=4, context=64, mlp_ratio=2, n_experts=8, top_k=2)
BATCH = 16
WORKERS = tuple(f"worker{i}" for i in range(4))
ROWS = {"full replica (8 of 8)": 8, "r = 2 (4 of 8)": 4, "r = 1 (2 of 8)": 2}
TARGET_R1 = 1.3
FULL_SYNC = "full replica (r = W = 4: DiLoCo's bytes, plus routing counts)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps_per_rep", type=int, default=2, help="inner steps per timed call")
    parser.add_argument("--inner_steps", type=int, default=25, help="H, for the bytes per round")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--json", type=Path, default=_HERE / "results" / "fomoe.json")
    return parser.parse_args(argv)


def sampler(seed: int = 0) -> BatchSampler:
    train = split_text(load_text("builtin:pydoc")).train
    return BatchSampler(train, batch_size=BATCH, context=CONFIG.context, generator=torch.Generator().manual_seed(seed))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(repeats: int, steps_per_rep: int, device: torch.device) -> dict[str, dict[str, Any]]:
    """Seconds per inner step of every row, interleaved; repetition 0 is the untimed warm-up."""
    rows = {}
    for name, resident in ROWS.items():
        replica = FomoeReplica("bench", build_moe_model(CONFIG, seed=0, device=device), range(resident),
                               diloco=DilocoConfig(inner_steps=10**9))
        replica.begin_round()
        rows[name] = {"replica": replica, "sampler": sampler(), "seconds": [], "skip": []}
    names = list(rows)
    for rep in range(repeats + 1):
        print(f"repetition {rep}" + (" (warm-up)" if rep == 0 else ""), file=sys.stderr, flush=True)
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            row = rows[name]
            batches = [row["sampler"].sample(device) for _ in range(steps_per_rep)]
            _sync(device)
            start = time.perf_counter()
            reports = [row["replica"].inner_step(x, y) for x, y in batches]
            _sync(device)
            if rep > 0:
                row["seconds"].append((time.perf_counter() - start) / steps_per_rep)
                row["skip"].extend(r.skip_fraction for r in reports)
    return {name: {"seconds": row["seconds"], "skip_fraction": statistics.mean(row["skip"])}
            for name, row in rows.items()}


def predicted_flops(device: torch.device) -> dict[str, int]:
    """Forward + backward FLOPs of one batch per row, same model and batch, from torch's counter."""
    model = build_moe_model(CONFIG, seed=0, device=device)
    x, y = sampler(seed=1).sample(device)
    out = {}
    for name, resident in ROWS.items():
        with FlopCounterMode(display=False) as counter:
            logits, routing = model.forward_routed(x, resident=range(resident))
            (next_byte_loss(logits, y) + 0.01 * routing.aux_loss).backward()
        model.zero_grad(set_to_none=True)
        out[name] = counter.get_total_flops()
    return out


def sync_rows(inner_steps: int, device: torch.device) -> dict[str, dict[str, int]]:
    """Bytes per round, counted from real tensors, for FoMoE r = 1, 2, full replica and data parallel."""
    rows = {}
    for label, r in (("FoMoE r = 1", 1), ("FoMoE r = 2", 2), (FULL_SYNC, len(WORKERS))):
        placement = place_experts(WORKERS, n_experts=CONFIG.n_experts, replication=r, round=0)
        replicas = [FomoeReplica(w, build_moe_model(CONFIG, seed=0, device=device), placement.resident(w),
                                 diloco=DilocoConfig(inner_steps=2)) for w in WORKERS]
        samplers = [sampler(seed=10 + i) for i in range(len(WORKERS))]
        report = simulate_round(replicas, placement, lambda i, _r, _k, samplers=samplers: samplers[i].sample(device))
        formula = sync_bytes(replicas[0].layout, placement, idle=report.idle)
        if (report.up_bytes, report.down_bytes) != (formula.up_bytes, formula.down_bytes):
            raise AssertionError(f"{label}: counted {report.up_bytes, report.down_bytes} != formula {formula}")
        rows[label] = {"up": report.up_bytes, "down": report.down_bytes, "counts": report.counts_bytes}
    model = build_moe_model(CONFIG, seed=0, device=device)
    x, y = sampler(seed=2).sample(device)
    next_byte_loss(model(x), y).backward()
    gradient = update_bytes({n: p.grad for n, p in model.named_parameters()})
    per_round = len(WORKERS) * inner_steps * gradient
    rows[f"data parallel ({inner_steps} all-reduces)"] = {"up": per_round, "down": per_round, "counts": 0}
    return rows


def render(steps: dict, flops: dict, sync: dict, args: argparse.Namespace, load: tuple, device: torch.device) -> str:
    full = "full replica (8 of 8)"
    base = statistics.median(steps[full]["seconds"])
    lines = []
    for name, row in steps.items():
        median = statistics.median(row["seconds"])
        paired = statistics.median(b / t for b, t in zip(steps[full]["seconds"], row["seconds"], strict=True))
        verdict = f">= {TARGET_R1}x: " + ("pass" if base / median >= TARGET_R1 else "**FAIL**") if name.startswith(
            "r = 1") else ""
        lines.append([name, f"{1e3 * median:.1f}", f"{1e3 * min(row['seconds']):.1f} - {1e3 * max(row['seconds']):.1f}",
                      f"{base / median:.2f}x", f"{paired:.2f}x", f"{flops[full] / flops[name]:.2f}x",
                      f"{row['skip_fraction']:.3f}", verdict])
    step_table = markdown_table(["row", "median ms / step", "min - max ms", "speed-up", "paired speed-up",
                                 "FLOP-predicted", "skip fraction", "target"], lines)
    total = {k: v["up"] + v["down"] + v["counts"] for k, v in sync.items()}
    diloco, ddp = total[FULL_SYNC], max(total.values())
    byte_table = markdown_table(
        ["sync", "MB up", "MB down", "MB routing counts", "MB per round", "data parallel / this",
         "full replica / this"],
        [[k, f"{v['up'] / MB:.2f}", f"{v['down'] / MB:.2f}", f"{v['counts'] / MB:.5f}", f"{total[k] / MB:.2f}",
          f"{ddp / total[k]:.1f}x", f"{diloco / total[k]:.2f}x"] for k, v in sync.items()])
    caption = (f"{CONFIG.n_layers} blocks, width {CONFIG.d_model}, {CONFIG.n_experts} experts top-{CONFIG.top_k}, "
               f"batch {BATCH} x {CONFIG.context}, device {device}, {torch.get_num_threads()} thread(s); "
               f"median of {args.repeats} interleaved repetitions of {args.steps_per_rep} steps; "
               f"load average before {load[0]:.1f} / after {os.getloadavg()[0]:.1f}")
    return "\n\n".join([caption, step_table, f"Sync bytes per round, W = {len(WORKERS)}, H = {args.inner_steps} "
                        "(counted from the tensors of one real round):", byte_table])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    before = machine(device=str(device))
    load = before["load_average"]
    steps = time_steps(args.repeats, args.steps_per_rep, device)
    flops = predicted_flops(device)
    sync = sync_rows(args.inner_steps, device)
    table = render(steps, flops, sync, args, load, device)
    print(table)
    write_result(args.json, {"config": CONFIG.to_dict(), "steps": steps, "flops": flops, "sync": sync,
                             "table_markdown": table}, before=before, args=args)
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
