#!/usr/bin/env python3
"""``inference.py`` across real daemons: ``gossamer serve`` processes behind emulated WAN links,
``gossamer generate`` as the client, BlockTrain passes vs the autoregressive pipeline::

    nice -n 10 .venv/bin/python scripts/bench/inference_wan.py [--sizes 64 256] [--repeats 2]
        [--passes 4] [--mbit 100] [--latency_ms 50] [--json scripts/bench/results/inference_wan.json]"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import BenchError
from _wan_links import Links, Party

from gossamer_harness.report import machine, markdown_table, write_result
from gossamer_harness.wan import LinkProfile

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = 3
GENERATE_TIMEOUT_S = 600.0
RUN_TOML = """
[run]
name = "inference-wan"
protocol = "blocktrain"
heartbeat_s = 2.0
[model]
d_model = 128
n_heads = 4
context = 64
num_blocks = {blocks}
[hyper]
route_timeout_s = 30.0
"""


def generate(join: list[str], size: int, passes: int, baseline: bool, work: Path) -> dict[str, Any]:
    """One ``gossamer generate --json`` process; its summary."""
    args = [sys.executable, "-m", "gossamer.peer.cli", "generate", *join, "--json", "--new_bytes", str(size),
            "--passes", str(passes), "--seed", "5", "--timeout_s", "60", *(["--baseline", "ar"] if baseline else []),
            "The "]
    done = subprocess.run(args, capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S, cwd=work)
    if done.returncode != 0:
        raise BenchError(f"gossamer generate exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--mbit", type=float, default=100.0)
    parser.add_argument("--latency_ms", type=float, default=50.0)
    parser.add_argument("--work", type=Path, default=None, help="folder for logs (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/bench/results/inference_wan.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="inference_wan_"))
    (work / "run.toml").write_text(RUN_TOML.format(blocks=BLOCKS))
    links = Links(LinkProfile.from_mbit(args.mbit, args.latency_ms))
    before, started = machine(), time.monotonic()
    parties: list[Party] = []
    samples: list[dict[str, Any]] = []
    try:
        orch = Party("orch", ["orchestrator", "-c", str(work / "run.toml"), "--new_swarm"], work, None)
        parties.append(orch)
        ready = orch.ready(None)
        join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
        parties += [Party(f"server{k}", ["serve", *join, "--blocks", str(k), "--ar_stages", str(k)], work, links)
                    for k in range(BLOCKS)]
        for party in parties[1:]:
            party.ready(links)
        for repeat in range(args.repeats):
            for size in args.sizes:
                arms = (False, True) if repeat % 2 == 0 else (True, False)
                for baseline in arms:
                    name = "ar" if baseline else "blocktrain"
                    print(f"[rep {repeat}] {name}, {size} bytes", file=sys.stderr, flush=True)
                    result = generate(join, size, args.passes, baseline, work)
                    samples.append({"repeat": repeat, "bytes": size, "arm": name, "seconds": result["seconds"],
                                    "passes": result["passes"], "retries": result["retries"],
                                    "hops": result["hops"], "new_bytes": result["new_bytes"]})
        wire = links.wire_bytes()
    finally:
        for party in reversed(parties):
            party.proc.stop()
        links.close()
    rows = summarise(samples, args.sizes)
    report = write_result(args.json, {"settings": {k: v for k, v in vars(args).items() if k not in ("work", "json")},
                                      "wall_s": time.monotonic() - started, "wire_bytes": wire, "samples": samples,
                                      "rows": rows}, before=before)
    print(render(report))
    print(f"\nJSON: {args.json}\nlogs: {work}", file=sys.stderr)
    return 0


def summarise(samples: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        row: dict[str, Any] = {"bytes": size}
        for arm in ("blocktrain", "ar"):
            mine = [s for s in samples if s["bytes"] == size and s["arm"] == arm]
            seconds = statistics.median(s["seconds"] for s in mine)
            passes = mine[0]["passes"]
            row[arm] = {"seconds": seconds, "passes": passes, "bytes_per_s": size / seconds,
                        "s_per_pass": seconds / passes, "retries": sum(s["retries"] for s in mine),
                        "runs": [s["seconds"] for s in mine]}
        row["speedup"] = row["blocktrain"]["bytes_per_s"] / row["ar"]["bytes_per_s"]
        row["target_speedup"] = size / row["blocktrain"]["passes"]
        rows.append(row)
    return rows


def render(report: dict[str, Any]) -> str:
    header = ["bytes", "BlockTrain passes", "BlockTrain bytes/s", "AR passes", "AR bytes/s",
              "s per pass, BT / AR", "speedup", "target L/N", "retries"]
    lines = []
    for row in report["rows"]:
        bt, ar = row["blocktrain"], row["ar"]
        lines.append([str(row["bytes"]), str(bt["passes"]), f"{bt['bytes_per_s']:.1f}", str(ar["passes"]),
                      f"{ar['bytes_per_s']:.2f}", f"{bt['s_per_pass']:.3f} / {ar['s_per_pass']:.3f}",
                      f"{row['speedup']:.2f}x", f"{row['target_speedup']:.2f}x", str(bt["retries"] + ar["retries"])])
    s = report["settings"]
    return (markdown_table(header, lines) + f"\n\nMedian of {s['repeats']} runs per cell; links {s['mbit']:g} Mbit/s, "
            f"{s['latency_ms']:g} ms one way; load average {report['machine']['load_average'][0]:.1f} before, "
            f"{report['load_average_after'][0]:.1f} after; {report['wire_bytes'] / 1e6:.1f} MB through the proxies.")


if __name__ == "__main__":
    sys.exit(main())
