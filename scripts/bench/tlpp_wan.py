#!/usr/bin/env python3
"""TL++ step time across real processes (as protocols/tlpp/README.md starts them), on emulated
WAN links and on loopback, secure vs base (method and results: docs/BENCHMARKS.md)::

    nice -n 10 .venv/bin/python scripts/bench/tlpp_wan.py [--links wan loopback] [--modes base secure]
        [--steps 30] [--warmup 3] [--repeats 2] [--mbit 100] [--latency_ms 50] [--batch_size 96]"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import BenchError
from _wan_links import Links, Party

from gossamer_harness.report import load_average, machine, write_result
from gossamer_harness.tlpp.runs import BASE_NODE_COMMAND, secure_tables
from gossamer_harness.wan import LinkProfile

ROOT = Path(__file__).resolve().parents[2]
STEP_TIMEOUT_S = 120.0
NODES = 3
RUN_TOML = """
[run]
name = "tlpp-wan-{mode}"
protocol = "tlpp"
heartbeat_s = 2.0
[model]
cut = 3
[hyper]
mode = "{mode}"
batch_size = {batch_size}
optimizer = "adam"
lr = 0.01
steps = {steps}
eval_every = {steps}
min_nodes = {nodes}
node_timeout_s = 30.0
helper_timeout_s = 30.0
helper_wait_s = 10.0
{secure}"""


def start_parties(mode: str, work: Path, links: Links | None, s: argparse.Namespace) -> list[Party]:
    """The orchestrator first (its manifest), then the helper (secure) and the nodes."""
    names = [f"node{i}" for i in range(NODES)]
    secure, node_command = secure_tables(work, names) if mode == "secure" else ("", BASE_NODE_COMMAND)
    (work / "run.toml").write_text(RUN_TOML.format(mode=mode, batch_size=s.batch_size, steps=s.warmup + s.steps,
                                                   nodes=NODES, secure=secure))
    orch = Party("orch", ["orchestrator", "-c", str(work / "run.toml"), "--new_swarm"], work, links)
    parties = [orch]
    ready = orch.ready(links)
    join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
    if mode == "secure":
        parties.append(Party("helper", ["helper", *join], work, links))
    parties += [Party(name, [*node_command, *join, "--data", f"builtin:digits:shard={i}/{NODES}"], work, links)
                for i, name in enumerate(names)]
    for party in parties[1:]:
        party.ready(links)
    return parties


def run_one(mode: str, link: str, work: Path, s: argparse.Namespace) -> dict[str, Any]:
    """One run of ``mode`` on ``link``: every step event of the orchestrator and the proxies' bytes."""
    links = Links(LinkProfile.from_mbit(s.mbit, s.latency_ms)) if link == "wan" else None
    load_before = load_average()
    parties: list[Party] = []
    try:
        parties = start_parties(mode, work, links, s)
        orch = parties[0].proc
        steps, finished = [], None
        while finished is None:
            event = orch.wait_event(lambda e: e["event"] in ("tlpp.step", "tlpp.finished"), timeout_s=STEP_TIMEOUT_S)
            if event["event"] == "tlpp.finished":
                finished = event
            else:
                steps.append(event)
        wire = links.wire_bytes() if links is not None else 0
    finally:
        codes = [party.proc.stop() for party in reversed(parties)]
        if links is not None:
            links.close()
    return {"mode": mode, "link": link, "steps": steps, "finished": finished, "wire_bytes": wire,
            "exit_codes": codes, "load_before": load_before, "load_after": load_average()}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise_run(run: dict[str, Any], warmup: int) -> dict[str, Any]:
    timed = [e for e in run["steps"] if e["step"] >= warmup]
    if not timed:
        raise BenchError(f"{run['mode']} on {run['link']}: no timed step")
    walls = [e["wall_s"] for e in timed]
    return {"median_ms": 1000 * statistics.median(walls), "p10_ms": 1000 * quantile(walls, 0.1),
            "p90_ms": 1000 * quantile(walls, 0.9), "steps_per_s": len(walls) / sum(walls),
            "app_mb_per_step": statistics.mean(e["bytes_sent"] + e["bytes_received"] for e in timed) / 1e6,
            "wire_mb_per_step": run["wire_bytes"] / max(1, len(run["steps"])) / 1e6,
            "dropped": sum(len(e["rejected"]) for e in run["steps"]),
            "not_applied": sum(not e["applied"] for e in run["steps"]),
            "loss_first": run["steps"][0]["loss"], "loss_last": run["steps"][-1]["loss"],
            "test_loss": (run["finished"] or {}).get("test_loss")}


def render(report: dict[str, Any]) -> str:
    s = report["settings"]
    rows = ["| link | mode | step ms, median (p10 - p90) | steps / s | orchestrator MB / step | wire MB / step "
            "| nodes dropped | steps not applied | train loss first -> last | test loss | load before / after |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        m = run["summary"]
        test = f"{m['test_loss']:.3f}" if m["test_loss"] is not None else "-"
        rows.append(f"| {run['link']} (rep {run['repeat']}) | {run['mode']} | {m['median_ms']:.0f} "
                    f"({m['p10_ms']:.0f} - {m['p90_ms']:.0f}) | {m['steps_per_s']:.2f} | {m['app_mb_per_step']:.3f} "
                    f"| {m['wire_mb_per_step']:.3f} | {m['dropped']} | {m['not_applied']} "
                    f"| {m['loss_first']:.3f} -> {m['loss_last']:.3f} | {test} "
                    f"| {run['load_before'][0]:.1f} / {run['load_after'][0]:.1f} |")
    lines = ["\n".join(rows), ""]
    for link, ratios in report["secure_over_base"].items():
        lines.append(f"secure / base on {link}, paired per repetition: "
                     + ", ".join(f"{r:.2f}x" for r in ratios)
                     + (f" (median {statistics.median(ratios):.2f}x)" if ratios else ""))
    lines.append(f"\n{s['steps']} timed steps after {s['warmup']} of warm-up per run; links {s['mbit']:g} Mbit/s, "
                 f"{s['latency_ms']:g} ms one way.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--links", nargs="+", choices=("wan", "loopback"), default=["wan", "loopback"])
    parser.add_argument("--modes", nargs="+", choices=("base", "secure"), default=["base", "secure"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--mbit", type=float, default=100.0)
    parser.add_argument("--latency_ms", type=float, default=50.0)
    parser.add_argument("--batch_size", type=int, default=96)
    parser.add_argument("--work", type=Path, default=None, help="folder for logs (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/bench/results/tlpp_wan.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tlpp_wan_"))
    runs: list[dict[str, Any]] = []
    before, started = machine(), time.monotonic()
    for repeat in range(args.repeats):
        for link in args.links:
            modes = args.modes if repeat % 2 == 0 else list(reversed(args.modes))
            for mode in modes:
                run_work = work / f"{link}-{mode}-{repeat}"
                run_work.mkdir(parents=True)
                print(f"[rep {repeat}] {mode} on {link}", file=sys.stderr, flush=True)
                run = run_one(mode, link, run_work, args)
                run.update(repeat=repeat, summary=summarise_run(run, args.warmup))
                runs.append(run)
    ratios: dict[str, list[float]] = {}
    for link in args.links:
        for repeat in range(args.repeats):
            by_mode = {r["mode"]: r["summary"]["median_ms"] for r in runs if r["link"] == link and r["repeat"] == repeat}
            if {"base", "secure"} <= by_mode.keys():
                ratios.setdefault(link, []).append(by_mode["secure"] / by_mode["base"])
    report = write_result(args.json, {"settings": {k: v for k, v in vars(args).items() if k not in ("work", "json")},
                                      "wall_s": time.monotonic() - started, "runs": runs,
                                      "secure_over_base": ratios}, before=before)
    print(render(report))
    print(f"\nJSON: {args.json}\nlogs: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
