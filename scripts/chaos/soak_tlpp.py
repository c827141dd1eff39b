#!/usr/bin/env python3
"""Soak: a long TL++ run of real daemons (orchestrator, helper in secure mode, three data nodes)
and whether anything grows that should not, with every step's ledger checked::

    .venv/bin/python scripts/chaos/soak_tlpp.py [--mode secure] [--steps 2000] [--every 10] [--json PATH]"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _soak import Sampler, report

from gossamer_harness.localproc import LOOPBACK, GossamerProcess
from gossamer_harness.report import load_average_text
from gossamer_harness.tlpp.runs import BASE_NODE_COMMAND, secure_tables

ROOT = Path(__file__).resolve().parents[2]
NODES = 3
RUN = """
[run]
name = "soak-tlpp"
protocol = "tlpp"
heartbeat_s = 2.0
[model]
cut = 3
[hyper]
mode = "{mode}"
batch_size = 48
optimizer = "adam"
lr = 0.003
steps = {steps}
epochs = 0
eval_every = {eval_every}
min_nodes = {nodes}
{secure}"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("base", "secure"), default="secure")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=10, help="sample /status every this many steps")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/soak_tlpp.json")
    args = parser.parse_args()
    load_before = load_average_text()
    work = Path(tempfile.mkdtemp(prefix="gossamer-soak-tlpp-"))  # kept: the logs are the evidence
    nodes = [f"node{i}" for i in range(NODES)]
    secure, node_command = secure_tables(work, nodes) if args.mode == "secure" else ("", BASE_NODE_COMMAND)
    (work / "run.toml").write_text(RUN.format(mode=args.mode, steps=args.steps, eval_every=max(1, args.steps // 10),
                                              nodes=NODES, secure=secure))

    def start(name: str, command: list[str]) -> GossamerProcess:
        return GossamerProcess([*command, *LOOPBACK, "--events", "--threads", "1", "--identity_path",
                                str(work / f"{name}.pem"), "--checkpoint_dir", str(work / "ckpt")],
                               log_path=work / f"{name}.log")

    procs: dict[str, GossamerProcess] = {}
    steps: list[dict] = []
    evals: list[dict] = []
    try:
        procs["orch"] = orch = start("orch", ["orchestrator", "-c", str(work / "run.toml"), "--new_swarm"])
        ready = orch.wait_ready()
        join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
        if args.mode == "secure":
            procs["helper"] = start("helper", ["helper", *join])
        for i, name in enumerate(nodes):
            procs[name] = start(name, [*node_command, *join, "--data", f"builtin:digits:shard={i}/{NODES}"])
        sampler = Sampler({"orch": ready["http"], **{name: proc.wait_ready(timeout_s=180)["http"]
                                                     for name, proc in procs.items() if proc is not orch}},
                          pids={name: proc.proc.pid for name, proc in procs.items()})
        started = time.monotonic()
        while True:
            event = orch.wait_event(lambda e: e["event"] in ("tlpp.step", "tlpp.eval", "tlpp.finished", "tlpp.error"),
                                    timeout_s=300)
            for proc in procs.values():
                if proc is not orch:
                    proc.drain()  # read them so no stdout pipe fills
            if event["event"] == "tlpp.eval":
                evals.append({"step": event["step"], "loss": event["loss"], "accuracy": event["accuracy"]})
            if event["event"] in ("tlpp.finished", "tlpp.error"):
                break
            if event["event"] == "tlpp.step":
                steps.append(event)
                if event["step"] % args.every == 0:
                    sampler.sample(event["step"], set(), lambda name: False)
        wall = time.monotonic() - started
    finally:
        codes = [proc.stop() for proc in procs.values()]
    times = [e["wall_s"] for e in steps]
    problems = [[e["step"], e["balance_problems"]] for e in steps if e["balance_problems"]]
    dropped = sum(len(e["rejected"]) for e in steps)
    p50, p99 = statistics.median(times), statistics.quantiles(times, n=100)[98]
    lines = [f"\nstep time p50 {1000 * p50:.0f} ms, p99 {1000 * p99:.0f} ms; steps {len(steps)} of {args.steps} "
             f"({event['event']}); nodes dropped from a step {dropped}; steps not applied "
             f"{sum(not e['applied'] for e in steps)}",
             "held-out loss / accuracy: " + ", ".join(f"step {e['step']}: {e['loss']:.3f} / {e['accuracy']:.3f}"
                                                      for e in evals[:1] + evals[-1:])]
    passed = report(f"TL++ soak ({args.mode}): {NODES} nodes, {len(steps)} steps in {wall:.0f} s", sampler,
                    half=args.steps // 2, unit="step",
                    extra={"args": {k: str(v) for k, v in vars(args).items()}, "wall_s": wall, "step_p50_s": p50,
                           "step_p99_s": p99, "step_times_s": times, "evals": evals, "dropped": dropped,
                           "end": event["event"]},
                    lines=lines, problems=problems, codes=codes, json_path=args.json, load_before=load_before,
                    work=work)
    return 0 if passed and event["event"] == "tlpp.finished" and len(steps) == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
