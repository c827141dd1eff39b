#!/usr/bin/env python3
"""Issue 30, item 7: one Byzantine FoMoE expert host of four (LocalNet, real HTTP, signed messages)
sends its update sign-flipped x20 with inflated pair counts; the honest hosts' held-out loss per
round, clean, attacked on the code before the fix (``--before`` ref, default HEAD) and after, and
the robust default's cost on a clean run. Each run is a child process on the same identities::

    nice -n 10 .venv/bin/python scripts/chaos/fomoe_byzantine.py [--rounds 8] [--before HEAD] [--json PATH]"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts" / "chaos")]

RUN: dict[str, Any] = {
    "run": {"name": "experts", "protocol": "fomoe", "heartbeat_s": 30.0},
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32, "n_experts": 4, "top_k": 2},
    "hyper": {"batch_size": 8, "eval_batches": 2, "min_hosts": 4, "update_deadline_s": 60.0,
              "commit_deadline_s": 60.0, "diloco": {"inner_steps": 6, "inner_lr": 0.003},
              "fomoe": {"replication": 2}},
}
TRUSTING = {"dense": "mean", "expert": "token_weighted_mean", "clip": False}
INFLATED = 10**6
"""The pairs the attacker claims for each expert it holds: more than its batches hold."""
# name -> (code, aggregator table or None for the code's defaults, claim or None for a clean run)
SCENARIOS: dict[str, tuple[str, dict[str, Any] | None, int | str | None]] = {
    "clean_before": ("before", None, None),
    "clean_after": ("after", None, None),
    "attacked_before": ("before", None, INFLATED),
    "attacked_before_bound": ("before", None, "bound"),
    "attacked_after": ("after", None, INFLATED),
    "attacked_after_bound": ("after", None, "bound"),
    "attacked_after_trusting_bound": ("after", TRUSTING, "bound"),
}


def child(name: str, work: Path, rounds: int) -> None:
    """One run in this process: print the honest hosts' held-out losses per round as JSON."""
    import gossamer
    from gossamer.crypto.identity import Identity
    from gossamer_harness.fomoe.byzantine import run_hosts

    _, aggregator, claim = SCENARIOS[name]
    run = {**RUN, "hyper": {**RUN["hyper"], "rounds": rounds, **({"aggregator": aggregator} if aggregator else {})}}
    identities = [Identity.load(work / f"h{i}.pem") for i in range(4)]
    byzantine = {3: {"claim": claim}} if claim is not None else None
    roles = asyncio.run(run_hosts(work / name, run, identities, byzantine=byzantine, timeout_s=900))
    honest = roles[:3] if claim is not None else roles
    print(json.dumps({"gossamer": str(Path(gossamer.__file__).parent),
                      "heldout": [[round(ledger.heldout_loss, 4) for ledger in role.history] for role in honest],
                      "byzantine_used": [sum(roles[3].peer_id in ledger.agreed for ledger in role.history)
                                         for role in honest] if claim is not None else None}))


def run_child(name: str, work: Path, rounds: int, env: dict[str, str] | None) -> dict[str, Any]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, __file__, "--child", name, "--work", str(work), "--rounds", str(rounds)],
                            capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{name}: exit {result.returncode}\n{result.stderr[-3000:]}")
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    last = [losses[-1] for losses in seen["heldout"]]
    return {**seen, "wall_s": round(time.monotonic() - started, 1), "last_mean": round(statistics.fmean(last), 4),
            "curve_mean": [round(statistics.fmean(r), 4) for r in zip(*seen["heldout"], strict=True)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2, help="identity sets (each a different data split)")
    parser.add_argument("--before", default="HEAD", help="git ref of the code before the fix")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/fomoe_byzantine.json")
    parser.add_argument("--child", choices=list(SCENARIOS), help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.work, args.rounds)
        return

    from _harness import baseline_code

    from gossamer.crypto.identity import Identity
    from gossamer_harness.report import load_average_text, machine, markdown_table, write_json

    load_before = load_average_text()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in SCENARIOS}
    with tempfile.TemporaryDirectory(prefix="gossamer-fomoe-byzantine-") as tmp:
        before = baseline_code(args.before, Path(tmp))
        envs = {"before": before.env, "after": None}
        for repeat in range(args.repeats):
            work = Path(tmp) / f"r{repeat}"
            work.mkdir()
            for i in range(4):
                Identity.create(work / f"h{i}.pem")
            for name, (code, _, _) in SCENARIOS.items():
                results[name].append(run_child(name, work, args.rounds, envs[code]))
                print(f"repeat {repeat} {name}: {results[name][-1]['curve_mean']}", flush=True)
                write_json(args.json, {"partial": True, "rounds": args.rounds, "runs": results})
    summary = {name: {"last_mean": round(statistics.fmean(r["last_mean"] for r in runs), 4),
                      "worst_round_mean": round(statistics.fmean(max(r["curve_mean"]) for r in runs), 4),
                      "curve_mean": [round(statistics.fmean(c), 4) for c in zip(*(r["curve_mean"] for r in runs),
                                                                                  strict=True)]}
               for name, runs in results.items()}
    print(markdown_table(["scenario", "last held-out (mean of honest hosts and repeats)", "curve"],
                         [[n, s["last_mean"], s["curve_mean"]] for n, s in summary.items()]))
    write_json(args.json, {"machine": machine(load_before=load_before, load_after=load_average_text()),
                           "rounds": args.rounds, "repeats": args.repeats, "before": args.before,
                           "claim": INFLATED, "scale": -20.0, "summary": summary, "runs": results})


if __name__ == "__main__":
    main()
