#!/usr/bin/env python3
"""One slow worker: wall-clock of a BlockTrain run with fixed deadlines against adaptive pacing.

Real processes through the CLI on 127.0.0.1: an orchestrator (the block coordinator) and three
block workers training the same single block, so every version of it waits for its workers. The
third worker runs under a CPU quota (a cgroup v1 ``cpu`` group the script creates and removes,
``--quota`` of one CPU; it needs root), so it trains several times slower than the others: a
volunteer whose machine is busy. Without cgroups the script says so and stops. The run's ``deadline_s`` (the ceiling) is generous, as it must
be for a real WAN. Arms (``hyper.pacing``): "fixed" waits up to ``deadline_s`` for every worker,
"adaptive" follows the measured update times and stops waiting for a worker flagged fail-slow.
Arms alternate, ``--repeats`` times each, so they share the machine's conditions.

Measured per run: wall-clock from the moment all three workers are assigned to ``finished``, the
held-out CE at the end (both arms must reach a similar one: adaptive must not buy speed with a
worse model), the updates used per version, and which workers the coordinator flagged.

    .venv/bin/python scripts/bench/slow_worker.py [--versions 30] [--local_steps 40] [--repeats 2] [--quota 0.2] [--json PATH]
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

from _slowdown import CpuQuota, load

from gossamer.crypto.identity import Identity
from gossamer_harness.localproc import LOOPBACK, GossamerProcess

ROOT = Path(__file__).resolve().parents[2]
RUN = """
[run]
name = "slow-bench"
protocol = "blocktrain"
heartbeat_s = 1.0
[model]
d_model = 32
n_heads = 2
context = 32
num_blocks = 1
[hyper]
versions = {versions}
local_steps = {local_steps}
batch_size = 8
lr = 0.003
deadline_s = {deadline_s}
eval_batches = 2
pacing = "{pacing}"
"""
def one_run(pacing: str, args: argparse.Namespace, work: Path, quota: CpuQuota) -> dict:
    work.mkdir(parents=True)
    (work / "run.toml").write_text(RUN.format(versions=args.versions, local_steps=args.local_steps,
                                              deadline_s=args.deadline_s, pacing=pacing))
    procs: list[GossamerProcess] = []
    try:
        orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                                "--threads", "1", "--identity_path", str(work / "owner.pem"), "--checkpoint_dir",
                                str(work / "ckpt")], log_path=work / "orch.log")
        procs.append(orch)
        ready = orch.wait_ready()
        ids, workers = {}, {}
        for name in ("slow", "fast0", "fast1"):  # the slow one first: it must be in the run from version 0
            ids[name] = Identity.create(work / f"{name}.pem").peer_id
            workers[name] = GossamerProcess(
                ["peer", "--roles", "block-worker", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"],
                 "--events", *LOOPBACK, "--threads", "1", "--identity_path", str(work / f"{name}.pem")],
                log_path=work / f"{name}.log", wrapper=quota.wrapper if name == "slow" else ())
            procs.append(workers[name])
            if name == "slow":
                workers[name].wait_ready(timeout_s=300)
        everyone = set(ids.values())
        orch.wait_event(lambda e: e["event"] == "blocktrain.assignment" and everyone <= set(e["assignment"]),
                        timeout_s=120)
        started = time.monotonic()
        versions = []
        while True:
            event = orch.wait_event(lambda e: e["event"] in ("blocktrain.version", "blocktrain.finished"),
                                    timeout_s=args.deadline_s * 3)
            if event["event"] == "blocktrain.finished":
                break
            versions.append({"used": len(event["used"]), "slow_used": ids["slow"] in event["used"],
                             "deadline_s": event["deadline_s"],
                             "flagged": [name for name, peer in ids.items() if peer in event["slow"]]})
        wall = time.monotonic() - started
        return {"pacing": pacing, "wall_s": wall, "heldout_ce": event["heldout_ce"],
                "initial_heldout_ce": event["initial_heldout_ce"], "versions": versions,
                "slow_flagged": any("slow" in v["flagged"] for v in versions),
                "fast_flagged": any(set(v["flagged"]) - {"slow"} for v in versions), "load": load()}
    finally:
        for proc in procs:
            proc.stop()


def interleaved(args: argparse.Namespace, tmp: Path, quota: CpuQuota) -> list[dict]:
    runs = []
    for repeat in range(args.repeats):
        for pacing in ("fixed", "adaptive"):
            result = one_run(pacing, args, tmp / f"{pacing}{repeat}", quota)
            runs.append(result)
            print(f"{pacing:8s} repeat {repeat}: {result['wall_s']:.1f} s, held-out CE "
                  f"{result['heldout_ce']:.3f}, load {result['load']}", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=30)
    parser.add_argument("--local_steps", type=int, default=40)
    parser.add_argument("--deadline_s", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quota", type=float, default=0.2, help="the slow worker's share of one CPU")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/bench/results/slow_worker.json")
    args = parser.parse_args()
    load_before = load()
    runs = []
    quota = CpuQuota(args.quota, script="slow_worker.py")
    try:
        with tempfile.TemporaryDirectory(prefix="gossamer-slow-") as tmp:
            runs = interleaved(args, Path(tmp), quota)
    finally:
        quota.remove()
    summary = {}
    for pacing in ("fixed", "adaptive"):
        mine = [r for r in runs if r["pacing"] == pacing]
        summary[pacing] = {"wall_s": statistics.median(r["wall_s"] for r in mine),
                           "heldout_ce": statistics.median(r["heldout_ce"] for r in mine),
                           "initial_heldout_ce": mine[0]["initial_heldout_ce"],
                           "slow_used_share": statistics.mean(v["slow_used"] for r in mine for v in r["versions"]),
                           "mean_deadline_s": statistics.mean(v["deadline_s"] for r in mine for v in r["versions"]),
                           "slow_flagged": all(r["slow_flagged"] for r in mine),
                           "fast_flagged": any(r["fast_flagged"] for r in mine)}
    ratio = summary["adaptive"]["wall_s"] / summary["fixed"]["wall_s"]
    print(f"\nOne slow worker of three (a {args.quota:.0%} CPU quota), one block, {args.versions} versions of {args.local_steps} steps, "
          f"deadline_s {args.deadline_s:g} (ceiling); median of {args.repeats}; load before {load_before}, "
          f"after {load()}\n")
    print("| pacing | wall-clock (s) | held-out CE (start -> end) | versions using the slow worker | "
          "mean wait allowed (s) | slow worker flagged | a fast worker flagged |")
    print("|---|---|---|---|---|---|---|")
    for pacing, row in summary.items():
        print(f"| {pacing} | {row['wall_s']:.1f} | {row['initial_heldout_ce']:.3f} -> {row['heldout_ce']:.3f} | "
              f"{row['slow_used_share']:.0%} | {row['mean_deadline_s']:.1f} | {'yes' if row['slow_flagged'] else 'no'} | "
              f"{'yes' if row['fast_flagged'] else 'no'} |")
    print(f"\nadaptive / fixed wall-clock: {ratio:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                     "adaptive_over_fixed_wall": ratio, "runs": runs,
                                     "load_before": load_before, "load_after": load(),
                                     "machine": platform.platform(), "cpus": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
