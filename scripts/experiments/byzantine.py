"""Adaptive Byzantine attacks against every robust aggregator in DiLoCo with a shared model, each
cell's final held-out loss minus the clean run's (docs/EXPERIMENTS.md)::

    nice -n 10 .venv/bin/python scripts/experiments/byzantine.py [--quick] [--workers 2] [--seeds 3] [--fs 1,2,3]"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import torch
from _byzantine_cell import AGGREGATORS, ATTACKS, MOMENTUM_RULES, Settings, calibrate_tau, refusal, run_cell
from _common import RESULTS_DIR, TextTask, model_config, set_up

from gossamer.protocols.core.models import build_model
from gossamer_harness.report import machine, markdown_table, write_result

F_DEPENDENT = ("trimmed_mean", "krum", "multi_krum")
"""Aggregators whose clean run depends on the f they are configured with (the others only check it)."""
QUICK = Settings(rounds=3, inner_steps=2, wake_round=1)


@functools.cache
def _task(learners: int) -> TextTask:
    return TextTask.load(source="builtin:pydoc", learners=learners)


def _run(job: tuple[str, str | None, int, Settings, str]) -> dict:
    aggregator, attack, f, s, device_name = job
    device = set_up(device_name)
    start = time.perf_counter()
    cell = run_cell(aggregator, attack, f, s, _task(s.learners), device)
    return {**cell, "seconds": time.perf_counter() - start}


def clean_f(aggregator: str, f: int) -> int:
    """The f a clean run is keyed by: its own for the f-dependent aggregators, else -1 (shared)."""
    return f if aggregator in F_DEPENDENT else -1


def plan(s: Settings, *, aggregators: list[str], attacks: list[str], fs: list[int],
         seeds: int) -> tuple[dict[str, tuple], dict[str, str]]:
    """Jobs by cell key ``aggregator|f|attack|seed`` (attack 'clean'), and refused (aggregator, f)."""
    jobs: dict[str, tuple] = {}
    refused: dict[str, str] = {}
    for aggregator in aggregators:
        for f in fs:
            reason = refusal(aggregator, f=f, n=s.learners)
            if reason:
                refused[f"{aggregator}|{f}"] = reason
                continue
            for seed in range(seeds):
                seeded = replace(s, seed=seed)
                jobs.setdefault(f"{aggregator}|{clean_f(aggregator, f)}|clean|{seed}", (aggregator, None, f, seeded))
                for attack in attacks:
                    jobs[f"{aggregator}|{f}|{attack}|{seed}"] = (aggregator, attack, f, seeded)
    return jobs, refused


def run_jobs(jobs: dict[str, tuple], *, workers: int, device: str, checkpoint: Path | None) -> dict[str, dict]:
    """Every job, the clean ones first (they train all learners: the longest), then seed by seed
    (a first look at every cell early), in ``workers`` processes. With a ``checkpoint`` file each finished cell is appended to it as a JSON line, and
    cells already there are not run again (a long grid survives an interruption)."""
    cells = finished(jobs, checkpoint)
    keys = sorted((key for key in jobs if key not in cells), key=lambda key: ("|clean|" not in key, key.split("|")[-1]))
    payloads = [(*jobs[key], device) for key in keys]
    start = time.perf_counter()
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    results = pool.map(_run, payloads, chunksize=1) if pool is not None else map(_run, payloads)
    for done, (key, cell) in enumerate(zip(keys, results, strict=True), 1):
        cells[key] = cell
        if checkpoint is not None:
            with checkpoint.open("a") as out:
                out.write(json.dumps({"key": key, "cell": cell}) + "\n")
        print(f"[{done}/{len(keys)} {time.perf_counter() - start:.0f} s] {key}: "
              f"{cell.get('loss', cell['outcome'])}", flush=True)
    if pool is not None:
        pool.shutdown()
    return cells


def finished(jobs: dict[str, tuple], checkpoint: Path | None) -> dict[str, dict]:
    """The cells of ``jobs`` that the ``checkpoint`` file already holds."""
    cells: dict[str, dict] = {}
    if checkpoint is not None and checkpoint.exists():
        for line in checkpoint.read_text().splitlines():
            record = json.loads(line)
            if record["key"] in jobs:
                cells[record["key"]] = record["cell"]
    return cells


def unigram_cross_entropy(task: TextTask) -> float:
    """Held-out cross-entropy (nats/byte) of the training bytes' frequencies (add-one smoothed):
    what a model that learned only byte frequencies reaches."""
    train = torch.cat(task.shards).long()
    counts = torch.bincount(train, minlength=256).double() + 1
    return float(-(counts / counts.sum()).log()[task.heldout.long()].mean())


def delta(cells: dict, aggregator: str, f: int, attack: str, seeds: int) -> tuple[list[float], list[str]]:
    """Per seed: attacked loss minus the clean loss of the same seed; non-ok outcomes by name."""
    values, outcomes = [], []
    for seed in range(seeds):
        cell = cells.get(f"{aggregator}|{f}|{attack}|{seed}")
        clean = cells.get(f"{aggregator}|{clean_f(aggregator, f)}|clean|{seed}")
        if cell is None or clean is None:  # --report_only: not run (yet)
            continue
        if cell["outcome"] != "ok" or clean["outcome"] != "ok":
            outcomes.append(cell["outcome"] if cell["outcome"] != "ok" else "clean " + clean["outcome"])
        else:
            values.append(cell["loss"] - clean["loss"])
    return values, outcomes


def cell_text(values: list[float], outcomes: list[str], seeds: int) -> str:
    if outcomes:
        return "/".join(sorted(set(outcomes))) + f" ({len(outcomes)} of {len(values) + len(outcomes)})"
    return spread_text(values, seeds, signed=True)


def worst_text(cells: dict, aggregator: str, f: int, attacks: list[str], seeds: int, refused: dict) -> str:
    """The attack that cost ``aggregator`` most at ``f`` (mean over seeds; a diverged seed counts as
    the worst)."""
    if f"{aggregator}|{f}" in refused:
        return "refused"
    costs = {}
    for attack in attacks:
        values, outcomes = delta(cells, aggregator, f, attack, seeds)
        if outcomes:
            return f"{attack}: {outcomes[0]}"
        if values:
            costs[attack] = statistics.mean(values)
    if not costs:
        return "not run"
    attack = max(costs, key=costs.__getitem__)
    return f"{costs[attack]:+.3f} {attack}"


def spread_text(values: list[float], seeds: int, *, signed: bool) -> str:
    """Mean (spread max - min) over the seeds run; fewer than ``seeds`` say how many ('not run': none)."""
    if not values:
        return "not run"
    text = f"{statistics.mean(values):{'+' if signed else ''}.3f}"
    text += f" ({max(values) - min(values):.3f})" if len(values) > 1 else ""
    return text + (f" [{len(values)} seed{'s' if len(values) > 1 else ''}]" if len(values) < seeds else "")


def render(cells: dict, refused: dict, s: Settings, *, aggregators: list[str], attacks: list[str],
           fs: list[int], seeds: int, context: dict) -> str:
    gap = context["unigram"] - statistics.mean(context["clean_mean_losses"])
    parts = [
        f"Settings: {asdict(s)}; {context['parameters']:,} parameters; {seeds} seed(s).",
        f"Held-out cross-entropy (nats/byte): initial model {context['initial_loss']:.3f}; unigram (byte "
        f"frequencies) {context['unigram']:.3f}; clean mean aggregator {statistics.mean(context['clean_mean_losses']):.3f} "
        f"({abs(gap):.3f} {'below' if gap > 0 else 'above'} unigram). Cells: final held-out loss minus the same aggregator's clean run (same f "
        "setting and seed, all learners honest), mean over seeds, and in brackets the spread (max - min) of "
        "the per-seed differences. 'refused': the aggregator cannot be robust against f of "
        f"{s.learners}. 'diverged': non-finite loss.",
    ]
    for f in fs:
        clean_row = ["clean (absolute loss)"]
        for a in aggregators:
            if f"{a}|{f}" in refused:
                clean_row.append("refused")
                continue
            losses = [cells[key].get("loss", math.nan) for seed in range(seeds)
                      if (key := f"{a}|{clean_f(a, f)}|clean|{seed}") in cells]
            clean_row.append(spread_text(losses, seeds, signed=False))
        rows = [clean_row]
        for attack in attacks:
            rows.append([attack] + ["refused" if f"{a}|{f}" in refused else cell_text(*delta(cells, a, f, attack, seeds), seeds)
                                    for a in aggregators])
        rows.append(["**worst attack**"] + [worst_text(cells, a, f, attacks, seeds, refused) for a in aggregators])
        parts += [f"f = {f} Byzantine of {s.learners}:", markdown_table(["attack", *aggregators], rows)]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI smoke run: 3 rounds of 2 steps, one seed, f=2")
    parser.add_argument("--fs", default=None, help="comma-separated f values (default 1,2,3)")
    parser.add_argument("--attacks", default=",".join(ATTACKS))
    parser.add_argument("--aggregators", default=",".join(AGGREGATORS), help=f"also accepted: {', '.join(MOMENTUM_RULES)}")
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 3, quick 1)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--name", default=None, help="results file stem (default byzantine[_quick])")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="JSON-lines file of finished cells: appended to, and cells in it are not rerun")
    parser.add_argument("--report_only", action="store_true",
                        help="run nothing: tabulate the cells --checkpoint holds (a cell with fewer seeds says so)")
    args = parser.parse_args(argv)
    before = machine()
    if args.report_only and args.checkpoint is None:
        parser.error("--report_only needs --checkpoint")
    device = set_up(args.device)
    s = QUICK if args.quick else Settings()
    fs = [int(x) for x in (args.fs or ("2" if args.quick else "1,2,3")).split(",")]
    attacks, aggregators = args.attacks.split(","), args.aggregators.split(",")
    seeds = args.seeds or (1 if args.quick else 3)
    if sorted(set(attacks) - set(ATTACKS)):
        parser.error(f"--attacks: unknown {sorted(set(attacks) - set(ATTACKS))}; known: {list(ATTACKS)}")
    if sorted(set(aggregators) - {*AGGREGATORS, *MOMENTUM_RULES}):
        parser.error(f"--aggregators: unknown {sorted(set(aggregators) - {*AGGREGATORS, *MOMENTUM_RULES})}")
    task = _task(s.learners)
    s = replace(s, tau=s.tau or calibrate_tau(s, task, device))
    load_before = os.getloadavg()
    start = time.perf_counter()
    jobs, refused = plan(s, aggregators=aggregators, attacks=attacks, fs=fs, seeds=seeds)
    if "mean" not in aggregators:  # the clean mean is the baseline every table states
        jobs.update({f"mean|-1|clean|{seed}": ("mean", None, 0, replace(s, seed=seed)) for seed in range(seeds)})
    cells = (finished(jobs, args.checkpoint) if args.report_only
             else run_jobs(jobs, workers=args.workers, device=args.device, checkpoint=args.checkpoint))
    initial = build_model(model_config(d_model=s.d_model, n_layers=s.n_layers, context=s.context), seed=0,
                          device=device)
    context = {"initial_loss": task.heldout_loss(initial, context=s.context, device=device),
               "unigram": unigram_cross_entropy(task), "parameters": sum(p.numel() for p in initial.parameters()),
               "clean_mean_losses": [cells[key].get("loss", math.nan) for seed in range(seeds)
                                     if (key := f"mean|-1|clean|{seed}") in cells],
               "wall_s": time.perf_counter() - start, "workers": args.workers, "load_average_before": load_before,
               "load_average_after": os.getloadavg()}
    markdown = render(cells, refused, s, aggregators=aggregators, attacks=attacks, fs=fs, seeds=seeds, context=context)
    if args.report_only:
        run_s = sum(cell.get("seconds", 0.0) for cell in cells.values())
        markdown += (f"\n\nReport of the cells in {args.checkpoint.name} ({len(cells)} of {len(jobs)} planned; "
                     f"{run_s / 3600:.1f} h of cell run time in all, each cell's in the JSON).")
    else:
        markdown += (f"\n\nWall time {context['wall_s'] / 60:.1f} min with {args.workers} worker process(es); "
                     f"load average {load_before[0]:.1f} before, {context['load_average_after'][0]:.1f} after.")
    print(markdown)
    name = args.name or ("byzantine_quick" if args.quick else "byzantine")
    command = "scripts/experiments/byzantine.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_result(RESULTS_DIR / f"{name}.json", {"settings": asdict(s), **context, "fs": fs, "attacks": attacks,
                                                "aggregators": aggregators, "seeds": seeds, "refused": refused,
                                                "cells": cells, "command": command},
                 before=before, markdown=markdown, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
