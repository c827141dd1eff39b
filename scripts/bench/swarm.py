#!/usr/bin/env python3
"""Time from process start to "joined and visible to the orchestrator" for N peers started at
once, split into start -> ready and ready -> visible, and the idle daemons' memory::

    .venv/bin/python scripts/bench/swarm.py [--sizes 1 4 8] [--repeats 3] [--json PATH]"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gossamer.crypto.identity import Identity
from gossamer.peer.processes import child_pids
from gossamer_harness.localproc import LOOPBACK, GossamerProcess, rss_bytes
from gossamer_harness.report import machine, write_result

ROOT = Path(__file__).resolve().parents[2]

IDLE_S = 5.0


def one_swarm(size: int, work: Path) -> dict:
    """Start an orchestrator and ``size`` peers; return join times (s) and idle RSS (bytes)."""
    (work / "run.toml").write_text('[run]\nname = "bench"\nheartbeat_s = 1.0\n')
    orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                            "--identity_path", str(work / "owner.pem")], log_path=work / "orch.log")
    peers: list[GossamerProcess] = []
    try:
        ready = orch.wait_ready()
        ids = [Identity.create(work / f"p{i}.pem").peer_id for i in range(size)]
        starts = set(ids)
        for i in range(size):
            peers.append(GossamerProcess(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"],
                                          *LOOPBACK, "--events", "--identity_path", str(work / f"p{i}.pem")],
                                         log_path=work / f"p{i}.log"))
        visible: dict[str, float] = {}  # wall-clock time each peer first appeared in the orchestrator's table
        while len(visible) < size:
            event = orch.wait_event(lambda e: e["event"] == "peers", timeout_s=120)
            for peer_id in event["peer_ids"]:
                if peer_id in starts and peer_id not in visible:
                    visible[peer_id] = event["read_wall_time"]
        ready_at = [p.wait_ready()["wall_time"] for p in peers]
        time.sleep(IDLE_S)  # let the daemons settle into their idle heartbeat before reading memory
        daemon_rss = [rss_bytes(p.proc.pid) for p in peers]
        p2pd_rss = [sum(rss_bytes(c) for c in p.children()) for p in peers]
        return {"join_to_visible_s": [visible[i] - p.started_wall_time for i, p in zip(ids, peers, strict=True)],
                "start_to_ready_s": [r - p.started_wall_time for r, p in zip(ready_at, peers, strict=True)],
                "ready_to_visible_s": [visible[i] - r for i, r in zip(ids, ready_at, strict=True)],
                "daemon_rss_bytes": daemon_rss,
                "p2pd_rss_bytes": p2pd_rss, "children_per_peer": [len(child_pids(p.proc.pid)) for p in peers]}
    finally:
        for proc in [*peers, orch]:
            proc.stop()


def summarise(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "n": len(ordered)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/bench/results/swarm.json")
    args = parser.parse_args()
    before = machine()
    rows = []
    for size in args.sizes:
        joins, rss, p2pd, startup, network = [], [], [], [], []
        for repeat in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix=f"gossamer-bench-{size}-{repeat}-") as work:
                result = one_swarm(size, Path(work))
            joins += result["join_to_visible_s"]
            startup += result["start_to_ready_s"]
            network += result["ready_to_visible_s"]
            rss += result["daemon_rss_bytes"]
            p2pd += result["p2pd_rss_bytes"]
            print(f"N={size} repeat {repeat + 1}: join {[round(j, 2) for j in result['join_to_visible_s']]} s",
                  file=sys.stderr, flush=True)
        rows.append({"peers": size, "join_to_visible_s": summarise(joins), "start_to_ready_s": summarise(startup),
                     "ready_to_visible_s": summarise(network), "daemon_rss_mb": summarise([r / 2**20 for r in rss]),
                     "p2pd_rss_mb": summarise([r / 2**20 for r in p2pd]), "raw": {"join": joins, "rss": rss, "p2pd": p2pd}})
    print_table(rows)
    write_result(args.json, {"repeats": args.repeats, "rows": rows}, before=before)
    return 0


def print_table(rows: list[dict]) -> None:
    print("| peers started at once | join-to-visible median (s) | min / p90 / max (s) | of which start -> ready median (s) "
          "| ready -> visible median (s) | samples | idle daemon RSS median / max (MB) | its p2pd RSS (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        j, r, p = row["join_to_visible_s"], row["daemon_rss_mb"], row["p2pd_rss_mb"]
        s, v = row["start_to_ready_s"], row["ready_to_visible_s"]
        print(f"| {row['peers']} | {j['median']:.2f} | {j['min']:.2f} / {j['p90']:.2f} / {j['max']:.2f} | {s['median']:.2f} "
              f"| {v['median']:.2f} | {j['n']} | {r['median']:.0f} / {r['max']:.0f} | {p['median']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
