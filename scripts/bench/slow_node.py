#!/usr/bin/env python3
"""One slow data node: wall-clock of a TL++ run with fixed node deadlines against adaptive pacing.

Real processes through the CLI on 127.0.0.1: an orchestrator (base mode, digits_cnn) and three
data nodes on digits shards, one torch thread each. Every virtual batch is drawn across the three,
so every step waits for each node's forward and backward. Once ready, the first node is moved
into a cgroup v1 ``cpu`` group limited to ``--share`` of one CPU (``_slowdown.CpuQuota``; it needs
root), so every request it answers takes several times longer: a data owner whose machine is
busy. (A ``DutyCycle``, stopped and continued every second, does not make a node persistently
slower here: steps take tens of milliseconds, so most of them fall in its running part and only
one in several waits for it; its median step time stays with the others' and it is not flagged.) ``node_timeout_s`` (the
ceiling) is generous, as it must be for a real WAN. Arms (``hyper.pacing``): "fixed" waits up to
``node_timeout_s`` for every node, so each step goes at the slow node's pace; "adaptive" (with
``node_floor_s`` = ``--floor_s``: the default floor, 5 s, is above anything this node costs a
step, so it would wait for it as fixed pacing does) drops the nodes still outstanding at a phase's
adaptive deadline once another node answered. Arms alternate, ``--repeats`` times each, so they
share the machine's conditions.

Measured per run, from the moment the three nodes are ready: the wall-clock until ``finished``,
the held-out loss and accuracy at the end (adaptive must not buy speed with a much worse model:
it trains on fewer of the slow owner's samples), the share of steps that used the slow node,
the mean forward deadline, and which nodes were flagged.

    .venv/bin/python scripts/bench/slow_node.py [--steps 40] [--repeats 2] [--share 0.015] [--floor_s 0.5] [--json PATH]
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

from _slowdown import CGROUP, CpuQuota, load

from gossamer.crypto.identity import Identity
from gossamer_harness.localproc import LOOPBACK, GossamerProcess

ROOT = Path(__file__).resolve().parents[2]
RUN = """
[run]
name = "slow-node-bench"
protocol = "tlpp"
heartbeat_s = 1.0
[hyper]
mode = "base"
batch_size = 32
optimizer = "adam"
lr = 0.01
steps = {steps}
eval_every = 0
min_nodes = 3
node_timeout_s = {timeout_s}
pacing = "{pacing}"
node_floor_s = {floor_s}
"""
NAMES = ("slow", "fast0", "fast1")


def one_run(pacing: str, args: argparse.Namespace, work: Path, quota: CpuQuota) -> dict:
    work.mkdir(parents=True)
    (work / "run.toml").write_text(RUN.format(steps=args.steps, timeout_s=args.timeout_s, pacing=pacing,
                                              floor_s=args.floor_s))
    procs: list[GossamerProcess] = []
    nodes: dict[str, GossamerProcess] = {}
    try:
        orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                                "--threads", "1", "--identity_path", str(work / "owner.pem"), "--checkpoint_dir",
                                str(work / "ckpt")], log_path=work / "orch.log")
        procs.append(orch)
        ready = orch.wait_ready()
        ids = {}
        for i, name in enumerate(NAMES):
            ids[name] = Identity.create(work / f"{name}.pem").peer_id
            nodes[name] = GossamerProcess(
                ["peer", "--roles", "node", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"],
                 "--data", f"builtin:digits:shard={i}/3", "--events", *LOOPBACK, "--threads", "1",
                 "--identity_path", str(work / f"{name}.pem")], log_path=work / f"{name}.log")
            procs.append(nodes[name])
        for proc in nodes.values():
            proc.wait_ready(timeout_s=300)
        (quota.path / "cgroup.procs").write_text(str(nodes["slow"].proc.pid))  # all its threads
        started = time.monotonic()
        steps = []
        while True:
            event = orch.wait_event(lambda e: e["event"] in ("tlpp.step", "tlpp.finished", "tlpp.error"),
                                    timeout_s=args.timeout_s * 4)
            if event["event"] != "tlpp.step":
                break
            steps.append(event)
        wall = time.monotonic() - started
        if event["event"] != "tlpp.finished":
            raise RuntimeError(f"training stopped: {event}")
        flagged = {name for name in NAMES for e in steps if ids[name] in e["slow"]}
        return {"pacing": pacing, "wall_s": wall, "test_loss": event["test_loss"],
                "test_accuracy": event["test_accuracy"], "steps": len(steps),
                "slow_used_share": statistics.mean(ids["slow"] in e["used"] for e in steps),
                "fast_always_used": all({ids["fast0"], ids["fast1"]} <= set(e["used"]) for e in steps),
                "mean_forward_deadline_s": statistics.mean(e["deadline_s"]["forward"] for e in steps),
                "first_flagged_step": next((e["step"] for e in steps if ids["slow"] in e["slow"]), None),
                "slow_flagged": "slow" in flagged, "fast_flagged": bool(flagged - {"slow"}), "load": load()}
    finally:
        if "slow" in nodes and nodes["slow"].proc.poll() is None:  # back to full speed: it shuts down promptly
            (CGROUP / "cgroup.procs").write_text(str(nodes["slow"].proc.pid))
        for proc in procs:
            proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--timeout_s", type=float, default=20.0, help="node_timeout_s: the ceiling")
    parser.add_argument("--floor_s", type=float, default=0.5, help="node_floor_s of the adaptive arm")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--share", type=float, default=0.015, help="the slow node's share of one CPU")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/bench/results/slow_node.json")
    args = parser.parse_args()
    load_before = load()
    runs = []
    quota = CpuQuota(args.share, script="slow_node.py")
    try:
        with tempfile.TemporaryDirectory(prefix="gossamer-slow-node-") as tmp:
            for repeat in range(args.repeats):
                for pacing in ("fixed", "adaptive"):
                    runs.append(one_run(pacing, args, Path(tmp) / f"{pacing}{repeat}", quota))
                    r = runs[-1]
                    print(f"{pacing:8s} repeat {repeat}: {r['wall_s']:.1f} s, test loss {r['test_loss']:.3f}, "
                          f"accuracy {r['test_accuracy']:.3f}, slow node used in {r['slow_used_share']:.0%} of "
                          f"steps, flagged from step {r['first_flagged_step']}, load {r['load']}", flush=True)
    finally:
        quota.remove()
    summary = {}
    for pacing in ("fixed", "adaptive"):
        mine = [r for r in runs if r["pacing"] == pacing]
        summary[pacing] = {key: statistics.median(r[key] for r in mine)
                           for key in ("wall_s", "test_loss", "test_accuracy", "slow_used_share",
                                       "mean_forward_deadline_s")}
        summary[pacing].update(slow_flagged=all(r["slow_flagged"] for r in mine),
                               fast_flagged=any(r["fast_flagged"] for r in mine),
                               fast_always_used=all(r["fast_always_used"] for r in mine))
    ratio = summary["adaptive"]["wall_s"] / summary["fixed"]["wall_s"]
    print(f"\nOne slow data node of three (a {args.share:.1%} CPU quota), base mode, {args.steps} steps, "
          f"node_timeout_s {args.timeout_s:g} (ceiling), adaptive node_floor_s {args.floor_s:g}; median of "
          f"{args.repeats}; load before {load_before}, after {load()}\n")
    print("| pacing | wall-clock (s) | held-out loss / accuracy | steps using the slow node | mean forward deadline (s) "
          "| slow node flagged | a fast node flagged or dropped |")
    print("|---|---|---|---|---|---|---|")
    for pacing, row in summary.items():
        print(f"| {pacing} | {row['wall_s']:.1f} | {row['test_loss']:.3f} / {row['test_accuracy']:.3f} | "
              f"{row['slow_used_share']:.0%} | {row['mean_forward_deadline_s']:.1f} | "
              f"{'yes' if row['slow_flagged'] else 'no'} | "
              f"{'yes' if row['fast_flagged'] or not row['fast_always_used'] else 'no'} |")
    print(f"\nadaptive / fixed wall-clock: {ratio:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "summary": summary,
                                     "adaptive_over_fixed_wall": ratio, "runs": runs, "load_before": load_before,
                                     "load_after": load(), "machine": platform.platform(), "cpus": os.cpu_count()},
                                    indent=1))


if __name__ == "__main__":
    main()
