#!/usr/bin/env python3
"""Soak: a long gossip-DiLoCo run of real daemons, and whether anything grows that should not.

An orchestrator and ``--peers`` learners start through the CLI on 127.0.0.1 (one torch thread
each) and train a very small byte LM for ``--rounds`` rounds with few inner steps, so that rounds
are short and many. After every round of learner 0 the script reads each learner's ``/status``
(``process``: asyncio tasks, open file descriptors, resident memory, threads) and records every
learner's round times. Over the second half of the run (the first half is warm-up: allocator
pools, caches, JIT) it fits a line to each series and reports the slope per 100 rounds, with the
pass rule "flat": RSS grows less than 5 MB per 100 rounds, tasks, fds and threads by less than 1.
Also: p50/p99 of the round time, and every learner's ledger of every round balanced
(``balance_problems`` empty in the ledgers ``/status`` shows, read after each round).

    .venv/bin/python scripts/chaos/soak.py [--peers 8] [--rounds 200] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from gossamer.crypto.identity import Identity
from gossamer.peer.testing.localproc import LOOPBACK, GossamerProcess

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
SERIES = ("rss_bytes", "asyncio_tasks", "open_fds", "threads")
FLAT_PER_100 = {"rss_bytes": 5e6, "asyncio_tasks": 1.0, "open_fds": 1.0, "threads": 1.0}


def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def status(http: str) -> dict:
    with urllib.request.urlopen(f"http://{http}/status", timeout=30) as reply:
        return json.loads(reply.read())


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/soak.json")
    args = parser.parse_args()
    load_before = load()
    with tempfile.TemporaryDirectory(prefix="gossamer-soak-") as tmp:
        work = Path(tmp)
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
            learners = procs[1:]
            https = [p.wait_ready(timeout_s=180)["http"] for p in learners]
            samples: dict[str, list[list[tuple[float, float]]]] = {name: [[] for _ in learners] for name in SERIES}
            round_times: list[float] = []
            problems: dict[tuple[int, int, str], list[str]] = {}
            started = time.monotonic()
            last = None
            while True:
                event = learners[0].wait_event(lambda e: e["event"] in ("diloco.round", "diloco.finished"),
                                               timeout_s=300)
                if event["event"] == "diloco.finished":
                    break
                for other in learners[1:]:
                    other.drain()  # their events are not needed; read them so no stdout pipe fills
                now = time.monotonic()
                if last is not None:
                    round_times.append(now - last)
                last = now
                for i, http in enumerate(https):
                    seen = status(http)
                    usage = seen["process"]
                    for ledger in seen["role_status"]["learner"]["ledgers"]:
                        for part in ("params", "pseudo_gradients"):
                            if ledger[part]["balance_problems"]:
                                problems[(i, ledger["round"], part)] = ledger[part]["balance_problems"]
                    for name in SERIES:
                        samples[name][i].append((float(event["round"]), float(usage[name])))
            wall = time.monotonic() - started
        finally:
            for proc in procs:
                proc.stop()
    half = args.rounds // 2
    slopes = {name: [100 * slope([p for p in peer if p[0] >= half]) for peer in samples[name]] for name in SERIES}
    worst = {name: max(slopes[name], key=abs) for name in SERIES}
    flat = {name: abs(worst[name]) < FLAT_PER_100[name] for name in SERIES}
    p50 = statistics.median(round_times)
    p99 = statistics.quantiles(round_times, n=100)[98] if len(round_times) >= 2 else p50
    print(f"\nSoak: {args.peers} learners, {args.rounds} rounds in {wall:.0f} s; load before {load_before}, "
          f"after {load()}\n")
    print("| series | first value (learner 0) | last value (learner 0) | worst slope per 100 rounds, 2nd half | flat |")
    print("|---|---|---|---|---|")
    for name in SERIES:
        first, final = samples[name][0][0][1], samples[name][0][-1][1]
        unit, scale = ("MB", 1e6) if name == "rss_bytes" else ("", 1.0)
        print(f"| {name} | {first / scale:.1f}{unit} | {final / scale:.1f}{unit} | {worst[name] / scale:+.2f}{unit} | "
              f"{'yes' if flat[name] else 'NO'} |")
    print(f"\nround time p50 {p50:.2f} s, p99 {p99:.2f} s; ledgers with balance problems: {len(problems)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "wall_s": wall,
                                     "slopes_per_100_rounds": slopes, "flat": flat, "round_time_p50_s": p50,
                                     "round_time_p99_s": p99, "balance_problems": [[*key, value] for key, value in problems.items()],
                                     "samples": samples, "round_times_s": round_times,
                                     "load_before": load_before, "load_after": load(), "cpus": os.cpu_count()}))
    if not all(flat.values()) or problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
