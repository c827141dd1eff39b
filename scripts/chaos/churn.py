#!/usr/bin/env python3
"""Churn: a gossip-DiLoCo run of real daemons where learners leave (SIGTERM, SIGKILL), hang
(SIGSTOP) and join every few rounds for 100+ rounds; it fails if the anchor learner stalls past
``--stall_s`` (choices from ``--seed``: any run replays; docs/RELIABILITY.md, "Churn")::

    .venv/bin/python scripts/chaos/churn.py [--peers 6] [--rounds 120] [--every 8] [--inner_steps 60] [--hang_rounds 4] [--seed N] [--json PATH]"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from gossamer.crypto.identity import Identity
from gossamer_harness.localproc import LOOPBACK, GossamerProcess
from gossamer_harness.report import load_average_text, write_result

ROOT = Path(__file__).resolve().parents[2]
RUN = """
[run]
name = "churn"
protocol = "diloco"
heartbeat_s = 2.0
[model]
d_model = 16
n_layers = 1
n_heads = 2
context = 16
[hyper]
rounds = {rounds}
batch_size = 4
eval_batches = 1
w1_grace_s = 2.0
w2_deadline_s = 10.0
min_learners = {peers}
[hyper.diloco]
inner_steps = {inner_steps}
inner_lr = 0.003
[hyper.mixing]
w1 = "ring"
w2 = "ring"
[admission]
policy = "open"
"""


class Swarm:
    """The orchestrator and the learners of one churn run, in ``work``."""

    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work = work
        (work / "run.toml").write_text(RUN.format(rounds=args.rounds, peers=args.peers, inner_steps=args.inner_steps))
        self.orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", *LOOPBACK,
                                     "--events", "--threads", "1", "--identity_path", str(work / "owner.pem")],
                                    log_path=work / "orch.log")
        self.ready = self.orch.wait_ready()
        self.live: dict[str, GossamerProcess] = {}
        self.gone: list[GossamerProcess] = []
        self.adopted = 0
        self.joiner_rounds = 0  # rounds the learners other than the anchor finished

    def start(self, name: str) -> GossamerProcess:
        if not (self.work / f"{name}.pem").exists():
            Identity.create(self.work / f"{name}.pem")
        proc = GossamerProcess(
            ["peer", "--roles", "learner", "--run", self.ready["run_id"], "--initial_peers", *self.ready["maddrs"],
             *LOOPBACK, "--events", "--threads", "1", "--identity_path", str(self.work / f"{name}.pem"),
             "--checkpoint_dir", str(self.work / f"ckpt-{name}")], log_path=self.work / f"{name}.log")
        self.live[name] = proc
        return proc

    def leave(self, name: str, sig: int) -> None:
        """Signal the learner and go on at once (``close`` collects it), so the anchor's events
        are read as they come."""
        proc = self.live.pop(name)
        self.count(proc.drain())
        proc.proc.send_signal(sig)
        self.gone.append(proc)

    def pump(self) -> None:
        """Read the others' events (so no stdout pipe fills) and count their adoptions."""
        for name, proc in self.live.items():
            if name != "l0":
                self.count(proc.drain())

    def count(self, events: list[dict]) -> None:
        for event in events:
            self.adopted += event["event"] == "diloco.adopted"
            self.joiner_rounds += event["event"] == "diloco.round"

    def close(self) -> None:
        for proc in [*self.live.values(), *self.gone, self.orch]:
            proc.stop()


def status(http: str) -> dict:
    with urllib.request.urlopen(f"http://{http}/status", timeout=30) as reply:
        return json.loads(reply.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--every", type=int, default=8, help="rounds of the anchor between two churn events")
    parser.add_argument("--inner_steps", type=int, default=60)
    parser.add_argument("--hang_rounds", type=int, default=4, help="rounds of the anchor a hung learner stays stopped")
    parser.add_argument("--stall_s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/churn.json")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    print(f"churn seed {seed} (replay: --seed {seed}); load {load_average_text()}", flush=True)
    load_before = load_average_text()
    leaves, joins, problems = [], [], {}
    round_at: list[tuple[int, float]] = []
    round_s: list[float] = []  # the anchor's own measure of each round
    hangs: list[dict] = []
    hung: dict[str, int] = {}  # name -> how many anchor rounds in to continue it
    tmp = tempfile.mkdtemp(prefix="gossamer-churn-")  # kept, with every daemon's log, when the run fails
    swarm = Swarm(Path(tmp), args)
    try:
        for i in range(args.peers):
            swarm.start(f"l{i}")
        anchor = swarm.live["l0"]
        http = anchor.wait_ready(timeout_s=300)["http"]
        started, next_name, first, last = time.monotonic(), args.peers, None, None
        while True:
            event = anchor.wait_event(lambda e: e["event"] in ("diloco.round", "diloco.finished"),
                                      timeout_s=args.stall_s)  # AssertionError: the run stalled
            swarm.pump()
            if event["event"] == "diloco.finished":
                last = event
                break
            first = first or event
            round_at.append((event["round"], time.monotonic() - started))
            round_s.append(event["wall_s"])
            try:
                ledgers = status(http)["role_status"]["learner"]["ledgers"]
            except OSError:  # its last round: the anchor may have finished and exited already
                ledgers = []
            for ledger in ledgers:
                for part in ("params", "pseudo_gradients"):
                    if ledger[part]["balance_problems"]:
                        problems[f"{ledger['round']} {part}"] = ledger[part]["balance_problems"]
            for name in [n for n, until in hung.items() if len(round_at) >= until]:
                os.killpg(swarm.live[name].proc.pid, signal.SIGCONT)
                del hung[name]
                print(f"round {event['round']}: {name} continued", flush=True)
            if len(round_at) % args.every or event["round"] >= args.rounds - args.every:
                continue
            name = rng.choice(sorted(n for n in swarm.live if n != "l0" and n not in hung))
            sig = (signal.SIGTERM, signal.SIGKILL, signal.SIGSTOP)[(len(leaves) + len(hangs)) % 3]
            if sig == signal.SIGSTOP:  # a hang: the whole process group, as a suspended laptop
                os.killpg(swarm.live[name].proc.pid, signal.SIGSTOP)
                hung[name] = len(round_at) + args.hang_rounds
                hangs.append({"round": event["round"], "name": name, "rounds": args.hang_rounds})
                print(f"round {event['round']}: {name} hung (SIGSTOP) for {args.hang_rounds} rounds", flush=True)
                continue
            swarm.leave(name, sig)
            leaves.append({"round": event["round"], "name": name, "how": sig.name})
            back = name if len(joins) % 2 == 1 else f"l{next_name}"
            next_name += back != name
            swarm.start(back)
            joins.append({"round": event["round"], "name": back, "returning": back == name})
            print(f"round {event['round']}: {name} left ({sig.name}), {back} joined", flush=True)
        wall = time.monotonic() - started
    except BaseException:
        print(f"the run failed; the daemons' logs are in {tmp}", flush=True)
        raise
    finally:
        for name in hung:  # a stopped process would not act on the SIGTERM that ends it
            os.killpg(swarm.live[name].proc.pid, signal.SIGCONT)
        swarm.close()
    shutil.rmtree(tmp)
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(round_at)]
    p50, p99 = statistics.median(round_s), statistics.quantiles(round_s, n=100)[98]
    summary = {"seed": seed, "rounds": len(round_at), "wall_s": wall, "leaves": len(leaves), "joins": len(joins), "hangs": len(hangs),
               "adopted": swarm.adopted, "other_learners_rounds": swarm.joiner_rounds, "longest_gap_s": max(gaps), "round_p50_s": p50, "round_p99_s": p99,
               "heldout_start": first["heldout_loss"] if first else None,
               "heldout_end": last.get("heldout_loss") if last else None, "unbalanced_ledgers": len(problems)}
    print(f"\nChurn: {args.peers} learners, {args.rounds} rounds, one leaves and one joins every {args.every} rounds "
          f"(seed {seed}); load before {load_before}, after {load_average_text()}\n")
    print("| rounds (anchor) | wall (s) | leaves (clean / crash) | joins (fresh / returning) | hangs | adoptions of the swarm's "
          "state | rounds the others finished | longest gap between rounds (s) | round p50 / p99 (s) | "
          "held-out start -> end | unbalanced ledgers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    clean = sum(leave["how"] == "SIGTERM" for leave in leaves)
    returning = sum(join["returning"] for join in joins)
    print(f"| {summary['rounds']} | {wall:.0f} | {len(leaves)} ({clean} / {len(leaves) - clean}) | {len(joins)} "
          f"({len(joins) - returning} / {returning}) | {len(hangs)} | {swarm.adopted} | {swarm.joiner_rounds} | {max(gaps):.1f} | {p50:.2f} / {p99:.2f} | "
          f"{summary['heldout_start']:.3f} -> {summary['heldout_end']:.3f} | {len(problems)} |")
    write_result(args.json, {"summary": summary, "leaves": leaves, "joins": joins, "hangs": hangs, "round_at": round_at,
                             "problems": problems, "load_before": load_before, "load_after": load_average_text()},
                 args=args, indent=1)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
