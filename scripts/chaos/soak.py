#!/usr/bin/env python3
"""Soak: a long gossip-DiLoCo run of real daemons and whether anything grows that should not
(``_soak``'s rule over the second half), with p50/p99 of the round time::

    .venv/bin/python scripts/chaos/soak.py [--peers 8] [--rounds 200] [--every 1] [--json PATH]"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _soak import Sampler, report

from gossamer.crypto.identity import Identity
from gossamer_harness.localproc import LOOPBACK, GossamerProcess
from gossamer_harness.report import load_average_text

ROOT = Path(__file__).resolve().parents[2]
RUN = """
[run]
name = "soak"
protocol = "diloco"
heartbeat_s = 2.0
[model]
d_model = 16
n_layers = 1
n_heads = 2
context = 16
[data]
source = "builtin:pydoc"
[hyper]
rounds = {rounds}
batch_size = 4
eval_batches = 1
w1_grace_s = 5.0
w2_deadline_s = 30.0
min_learners = {peers}
[hyper.diloco]
inner_steps = 2
inner_lr = 0.003
[hyper.mixing]
w1 = "ring"
w2 = "ring"
[admission]
policy = "open"
"""


def finished(learner: GossamerProcess) -> bool:
    """Whether the learner finished its rounds (it may close its servers before it exits)."""
    learner.wait_event(lambda e: e["event"] == "diloco.finished", timeout_s=30)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--every", type=int, default=1, help="sample /status after every this many rounds")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/soak.json")
    args = parser.parse_args()
    load_before = load_average_text()
    work = Path(tempfile.mkdtemp(prefix="gossamer-soak-"))  # kept: the logs of a failed soak are its evidence
    (work / "run.toml").write_text(RUN.format(rounds=args.rounds, peers=args.peers))
    procs: list[GossamerProcess] = []
    try:
        orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", *LOOPBACK,
                                "--events", "--threads", "1", "--identity_path", str(work / "owner.pem")],
                               log_path=work / "orch.log")
        procs.append(orch)
        ready = orch.wait_ready()
        for i in range(args.peers):
            Identity.create(work / f"l{i}.pem")
            procs.append(GossamerProcess(
                ["peer", "--roles", "learner", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"],
                 *LOOPBACK, "--events", "--threads", "1", "--identity_path", str(work / f"l{i}.pem"),
                 "--checkpoint_dir", str(work / f"ckpt{i}")], log_path=work / f"l{i}.log"))
        learners = dict(zip((f"learner{i}" for i in range(args.peers)), procs[1:], strict=True))
        sampler = Sampler({name: p.wait_ready(timeout_s=180)["http"] for name, p in learners.items()},
                          pids={name: p.proc.pid for name, p in learners.items()})
        anchor = learners["learner0"]
        round_times: list[float] = []
        problems: dict[tuple[str, int, str], list[str]] = {}
        started = time.monotonic()
        done: set[str] = set()
        while True:
            event = anchor.wait_event(lambda e: e["event"] in ("diloco.round", "diloco.finished"), timeout_s=300)
            if event["event"] == "diloco.finished":
                break
            for name, other in learners.items():  # read them so no stdout pipe fills
                if other is not anchor and any(e["event"] == "diloco.finished" for e in other.drain()):
                    done.add(name)  # ahead of learner 0: it finished and exits, nothing more to sample
            round_times.append(event["wall_s"])  # the learner's own time for the round
            if event["problems"]:
                problems[("learner0", event["round"], "round event")] = event["problems"]
            if event["round"] % args.every:
                continue
            # a learner whose /status refuses has finished and is closing; learner 0's own events
            # are read by this loop, so it is not waited on there
            seen = sampler.sample(event["round"], done,
                                  lambda name: name == "learner0" or finished(learners[name]))
            for name, doc in seen.items():
                for ledger in doc["role_status"]["learner"]["ledgers"]:
                    for part in ("params", "pseudo_gradients"):
                        if ledger[part]["balance_problems"]:
                            problems[(name, ledger["round"], part)] = ledger[part]["balance_problems"]
        wall = time.monotonic() - started
    finally:
        codes = [proc.stop() for proc in procs]
    p50 = statistics.median(round_times)
    p99 = statistics.quantiles(round_times, n=100)[98] if len(round_times) >= 2 else p50
    passed = report(f"Soak: {args.peers} learners, {args.rounds} rounds in {wall:.0f} s", sampler,
                    half=args.rounds // 2, unit="round",
                    extra={"args": {k: str(v) for k, v in vars(args).items()}, "wall_s": wall,
                           "round_time_p50_s": p50, "round_time_p99_s": p99, "round_times_s": round_times},
                    lines=[f"\nround time p50 {p50:.2f} s, p99 {p99:.2f} s"],
                    problems=[[*key, value] for key, value in problems.items()], codes=codes,
                    json_path=args.json, load_before=load_before, work=work)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
