#!/usr/bin/env python3
"""Soak: a long BlockTrain run of real daemons (the coordinator, three block workers, three blocks)
and whether anything grows that should not, with the coordinator's ledgers checked every version::

    .venv/bin/python scripts/chaos/soak_blocktrain.py [--versions 200] [--json PATH]"""

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

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3
BLOCKS = 3
RUN = """
[run]
name = "soak-blocktrain"
protocol = "blocktrain"
heartbeat_s = 2.0
[model]
d_model = 16
n_heads = 2
context = 16
num_blocks = {blocks}
[data]
source = "builtin:pydoc"
[hyper]
versions = {versions}
local_steps = 2
batch_size = 4
lr = 0.003
deadline_s = 30.0
eval_batches = 1
min_workers = {workers}
sample_bytes = 0
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=200, help="versions per block")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/soak_blocktrain.json")
    args = parser.parse_args()
    load_before = load_average_text()
    work = Path(tempfile.mkdtemp(prefix="gossamer-soak-blocktrain-"))  # kept: the logs are the evidence
    (work / "run.toml").write_text(RUN.format(blocks=BLOCKS, versions=args.versions, workers=WORKERS))

    def start(name: str, command: list[str]) -> GossamerProcess:
        return GossamerProcess([*command, *LOOPBACK, "--events", "--threads", "1", "--identity_path",
                                str(work / f"{name}.pem"), "--checkpoint_dir", str(work / f"ckpt-{name}")],
                               log_path=work / f"{name}.log")

    procs: dict[str, GossamerProcess] = {}
    problems: dict[tuple[int, int], list[str]] = {}
    gaps: list[float] = []
    heldout: list[tuple[int, float]] = []
    try:
        procs["orch"] = orch = start("orch", ["orchestrator", "-c", str(work / "run.toml"), "--new_swarm"])
        ready = orch.wait_ready()
        join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
        for i in range(WORKERS):
            procs[f"worker{i}"] = start(f"worker{i}", ["peer", "--roles", "block-worker", *join])
        workers = {name: proc for name, proc in procs.items() if proc is not orch}
        sampler = Sampler({"orch": ready["http"], **{name: proc.wait_ready(timeout_s=180)["http"]
                                                     for name, proc in workers.items()}},
                          pids={name: proc.proc.pid for name, proc in procs.items()})
        done: set[str] = set()
        started = last = time.monotonic()
        while True:
            event = orch.wait_event(lambda e: e["event"] in ("blocktrain.version", "blocktrain.finished"),
                                    timeout_s=300)
            for name, proc in workers.items():  # read them so no stdout pipe fills
                if any(e["event"] == "blocktrain.worker_finished" for e in proc.drain()):
                    done.add(name)
            if event["event"] == "blocktrain.finished":
                break
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            progress = sum(event["versions"])
            if event.get("heldout_ce") is not None:
                heldout.append((progress, event["heldout_ce"]))
            seen = sampler.sample(progress, done, lambda name: name in done)
            for ledger in seen.get("orch", {}).get("role_status", {}).get("block-coordinator", {}).get("ledgers", []):
                if ledger["closed"] and ledger["balance_problems"]:  # an open version is still collecting
                    problems[(ledger["block"], ledger["version"])] = ledger["balance_problems"]
        wall = time.monotonic() - started
    finally:
        codes = [proc.stop() for proc in procs.values()]
    p50, p99 = statistics.median(gaps), statistics.quantiles(gaps, n=100)[98]
    total = BLOCKS * args.versions
    lines = [f"\ntime between versions p50 {p50:.2f} s, p99 {p99:.2f} s; versions {event['versions']}",
             f"held-out CE {heldout[0][1]:.3f} (after {heldout[0][0]} versions) -> {heldout[-1][1]:.3f} "
             f"(after {heldout[-1][0]})" if heldout else "no held-out CE reported"]
    passed = report(f"BlockTrain soak: {WORKERS} workers, {BLOCKS} blocks x {args.versions} versions in {wall:.0f} s",
                    sampler, half=total / 2, unit="version",
                    extra={"args": {k: str(v) for k, v in vars(args).items()}, "wall_s": wall, "gap_p50_s": p50,
                           "gap_p99_s": p99, "gaps_s": gaps, "heldout_ce": heldout},
                    lines=lines, problems=[[*key, value] for key, value in problems.items()], codes=codes,
                    json_path=args.json, load_before=load_before, work=work)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
