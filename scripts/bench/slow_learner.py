#!/usr/bin/env python3
"""One slow learner: wall-clock of a gossip-DiLoCo run with fixed W2 deadlines against adaptive pacing.

Real processes through the CLI on 127.0.0.1: an orchestrator and three learners mixing globally
(W1 and W2 with everyone), one torch thread each. The first learner runs only ``--share`` of the
wall-clock (``_slowdown.DutyCycle``: stopped and continued every second, so the handicap holds on
a machine other jobs keep busy, where a CPU quota would not bind), so its rounds take several
times longer: a volunteer whose machine is busy. ``w2_deadline_s`` (the
ceiling) is generous, as it must be for a real WAN. Arms (``hyper.pacing``): "fixed" waits up to
``w1_grace_s`` / ``w2_deadline_s`` for every learner, so the fast ones go at the slow one's pace;
"adaptive" follows the measured arrivals and stops waiting for a learner flagged fail-slow (it
falls behind, and adopts the swarm's state when ``catch_up_rounds`` behind). Arms alternate,
``--repeats`` times each, so they share the machine's conditions.

Measured per run, from the moment every learner is ready: the wall-clock until both fast learners
have finished ``--rounds`` rounds, and until all three have; their held-out loss at the end (both
arms must reach a similar one: adaptive must not buy speed with a worse model); the share of the
fast learners' rounds that used the slow learner's pseudo-gradient; which learners were flagged.

    .venv/bin/python scripts/bench/slow_learner.py [--rounds 16] [--inner_steps 30] [--repeats 2] [--share 0.25] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from _slowdown import DutyCycle, load

from gossamer.crypto.identity import Identity
from gossamer_harness.localproc import LOOPBACK, GossamerProcess

ROOT = Path(__file__).resolve().parents[2]
RUN = """
[run]
name = "slow-learner-bench"
protocol = "diloco"
heartbeat_s = 5.0
[model]
d_model = 32
n_layers = 2
n_heads = 2
context = 32
[hyper]
rounds = {rounds}
batch_size = 8
eval_batches = 2
w1_grace_s = {w1_grace_s}
w2_deadline_s = {w2_deadline_s}
min_learners = 3
pacing = "{pacing}"
[hyper.diloco]
inner_steps = {inner_steps}
inner_lr = 0.003
[hyper.mixing]
w1 = "global"
w2 = "global"
[hyper.aggregator]
name = "mean"
"""
NAMES = ("slow", "fast0", "fast1")


def one_run(pacing: str, args: argparse.Namespace, work: Path) -> dict:
    work.mkdir(parents=True)
    (work / "run.toml").write_text(RUN.format(rounds=args.rounds, inner_steps=args.inner_steps, pacing=pacing,
                                              w1_grace_s=args.w1_grace_s, w2_deadline_s=args.w2_deadline_s))
    procs: list[GossamerProcess] = []
    slowdown: DutyCycle | None = None
    try:
        orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                                "--threads", "1", "--identity_path", str(work / "owner.pem")], log_path=work / "orch.log")
        procs.append(orch)
        ready = orch.wait_ready()
        ids, learners = {}, {}
        for name in NAMES:
            ids[name] = Identity.create(work / f"{name}.pem").peer_id
            learners[name] = GossamerProcess(
                ["peer", "--roles", "learner", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"],
                 "--events", *LOOPBACK, "--threads", "1", "--identity_path", str(work / f"{name}.pem"),
                 "--checkpoint_dir", str(work / f"ckpt-{name}")],
                log_path=work / f"{name}.log")
            procs.append(learners[name])
        for proc in learners.values():
            proc.wait_ready(timeout_s=300)
        slowdown = DutyCycle(learners["slow"].proc.pid, share=args.share)
        started = time.monotonic()
        finished: dict[str, float] = {}
        rounds: dict[str, list[dict]] = {name: [] for name in NAMES}
        while len(finished) < len(NAMES):
            for name, proc in learners.items():
                if name in finished:
                    continue
                for event in proc.poll_events():
                    if event["event"] == "diloco.round":
                        rounds[name].append(event)
                    elif event["event"] == "diloco.finished":
                        finished[name] = time.monotonic() - started
                        rounds[name].append(event)
                    elif event["event"] == "exited":
                        raise RuntimeError(f"{name} exited: {proc.log()[-2000:]}")
            if time.monotonic() - started > args.timeout_s:
                raise RuntimeError(f"the run did not finish in {args.timeout_s} s: finished {sorted(finished)}")
            time.sleep(0.2)  # polling the processes' event pipes, not synchronising with them
        fast_rounds = [e for name in ("fast0", "fast1") for e in rounds[name] if e["event"] == "diloco.round"]
        flagged = {name for name in NAMES for e in fast_rounds if ids[name] in e["slow"]}
        return {"pacing": pacing, "fast_wall_s": max(finished["fast0"], finished["fast1"]),
                "all_wall_s": max(finished.values()),
                "fast_heldout": statistics.mean(next(e["heldout_loss"] for e in reversed(rounds[name])
                                                     if e["event"] == "diloco.finished") for name in ("fast0", "fast1")),
                "initial_heldout": statistics.mean(rounds[name][0]["heldout_loss"] for name in ("fast0", "fast1")),
                "slow_used_share": statistics.mean(ids["slow"] not in e["timed_out"] and e["pgrads_used"] == 2
                                                   for e in fast_rounds),
                "slow_flagged": "slow" in flagged, "fast_flagged": bool(flagged - {"slow"}),
                "compute_s": {name: statistics.median(e["compute_s"] for e in rounds[name] if e["event"] == "diloco.round")
                              for name in NAMES},
                "slow_rounds_run": sum(e["event"] == "diloco.round" for e in rounds["slow"]), "load": load()}
    finally:
        if slowdown is not None:
            slowdown.stop()
        for proc in procs:
            proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--inner_steps", type=int, default=30)
    parser.add_argument("--w1_grace_s", type=float, default=5.0)
    parser.add_argument("--w2_deadline_s", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--share", type=float, default=0.25, help="the share of the wall-clock the slow learner runs")
    parser.add_argument("--timeout_s", type=float, default=1800.0)
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/bench/results/slow_learner.json")
    args = parser.parse_args()
    load_before = load()
    runs = []
    with tempfile.TemporaryDirectory(prefix="gossamer-slow-learner-") as tmp:
        for repeat in range(args.repeats):
            for pacing in ("fixed", "adaptive"):
                result = one_run(pacing, args, Path(tmp) / f"{pacing}{repeat}")
                runs.append(result)
                compute = ", ".join(f"{name} {s:.2f}" for name, s in result["compute_s"].items())
                print(f"{pacing:8s} repeat {repeat}: fast learners {result['fast_wall_s']:.1f} s, all "
                      f"{result['all_wall_s']:.1f} s, held-out {result['fast_heldout']:.3f}, median compute s: "
                      f"{compute}; load {result['load']}", flush=True)
    summary = {}
    for pacing in ("fixed", "adaptive"):
        mine = [r for r in runs if r["pacing"] == pacing]
        summary[pacing] = {key: statistics.median(r[key] for r in mine)
                           for key in ("fast_wall_s", "all_wall_s", "fast_heldout", "initial_heldout", "slow_used_share")}
        summary[pacing].update(slow_flagged=all(r["slow_flagged"] for r in mine),
                               fast_flagged=any(r["fast_flagged"] for r in mine))
    ratio = summary["adaptive"]["fast_wall_s"] / summary["fixed"]["fast_wall_s"]
    ratio_all = summary["adaptive"]["all_wall_s"] / summary["fixed"]["all_wall_s"]
    print(f"\nOne slow learner of three (running {args.share:.0%} of the time), global W1/W2, {args.rounds} rounds of "
          f"{args.inner_steps} inner steps, w1_grace_s {args.w1_grace_s:g}, w2_deadline_s {args.w2_deadline_s:g} "
          f"(ceiling); median of {args.repeats}; load before {load_before}, after {load()}\n")
    print("| pacing | fast learners done (s) | all done (s) | held-out loss, fast learners (start -> end) | "
          "fast rounds using the slow learner | slow learner flagged | a fast learner flagged |")
    print("|---|---|---|---|---|---|---|")
    for pacing, row in summary.items():
        print(f"| {pacing} | {row['fast_wall_s']:.1f} | {row['all_wall_s']:.1f} | {row['initial_heldout']:.3f} -> "
              f"{row['fast_heldout']:.3f} | {row['slow_used_share']:.0%} | {'yes' if row['slow_flagged'] else 'no'} | "
              f"{'yes' if row['fast_flagged'] else 'no'} |")
    print(f"\nadaptive / fixed wall-clock: fast learners {ratio:.2f}, all learners {ratio_all:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                     "adaptive_over_fixed_fast_wall": ratio, "adaptive_over_fixed_all_wall": ratio_all,
                                     "runs": runs, "load_before": load_before, "load_after": load(),
                                     "machine": platform.platform(), "cpus": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
