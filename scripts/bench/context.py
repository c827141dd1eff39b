"""One training step of a 4-member context-parallel ring over emulated WAN links, compressed vs
dense keys and values, split into compute and exposed communication (docs/BENCHMARKS.md)::

    nice -n 10 .venv/bin/python scripts/bench/context.py [--repeats 5] [--batch_size 4] [--mbit 300] [--latency_ms 50]"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from _common import Scenario, ScenarioRun
from _context_member import MODES, member_worker

from gossamer.protocols.context.core import SubspaceConfig
from gossamer_harness.report import MB, load_average_text, machine, markdown_table, write_result

CHUNKS = 4
MODEL = {"d_model": 128, "n_layers": 2, "n_heads": 4, "context": 2048}
DEFAULT_ARMS = "dense,r2,r1-m4"
TARGET_EXPOSED = 0.20
TARGET_SPEEDUP = 5.0


def parse_arm(label: str) -> dict[str, Any]:
    """``dense``, ``r2``, ``r1-m4`` -> a SubspaceConfig table."""
    if label == "dense":
        return SubspaceConfig().to_dict()
    rank, _, mixtures = label.removeprefix("r").partition("-m")
    return SubspaceConfig(rank=int(rank), mixtures=int(mixtures or 1)).to_dict()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per combination")
    parser.add_argument("--batch_size", type=int, default=4, help="sequences of 2048 bytes per step")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help="comma-separated: dense, rR, rR-mM")
    parser.add_argument("--mbit", type=float, default=300.0, help="link rate, Mbit/s per direction")
    parser.add_argument("--latency_ms", type=float, default=50.0, help="one-way latency")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--step_timeout_s", type=float, default=600.0)
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "context.json")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    arms = [parse_arm(label) for label in args.arms.split(",")]
    combos = len(arms) * len(MODES)
    base = {"chunks": CHUNKS, "arms": arms, "model": MODEL, "batch_size": args.batch_size, "seed": 0,
            "mbit_per_s": args.mbit, "latency_ms": args.latency_ms, "device": device,
            "step_timeout_s": args.step_timeout_s}
    scenario = Scenario(name="context", workers=[(member_worker, {**base, "index": i}) for i in range(CHUNKS)],
                        repeats=combos * (args.repeats + 1) - 1, step_timeout_s=args.step_timeout_s)
    ring = ScenarioRun(scenario)
    try:
        ring.start()
        ring.exchange(("peers", ring.readies), "connected")
        for rep in range(combos * (args.repeats + 1)):
            print(f"step {rep}" + (" (warm-up)" if rep < combos else ""), file=sys.stderr, flush=True)
            ring.step()
        ring.stop()
    finally:
        ring.end()
    return {"settings": {**base, "repeats": args.repeats}, "steps": ring.reps[combos:], "extras": ring.extras}


def summarise(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per coding: medians of each mode's step, paired exposed communication, compute, bytes."""
    by: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
    for members in result["steps"]:
        by.setdefault((members[0]["arm"], members[0]["mode"]), []).append(members)
    labels = list(dict.fromkeys(arm for arm, _ in by))
    rows: dict[str, dict[str, Any]] = {}
    for label in labels:
        wan, direct = by[(label, "wan")], by[(label, "direct")]
        wan_s, direct_s = [_step_s(m) for m in wan], [_step_s(m) for m in direct]
        link_s = [_step_s(m) for m in by[(label, "link-only")]]
        exposed = [w - d for w, d in zip(wan_s, direct_s, strict=True)]
        rows[label] = {
            "wan_step_s": statistics.median(wan_s), "direct_step_s": statistics.median(direct_s),
            "link_only_s": statistics.median(link_s), "wan_steps_s": wan_s, "direct_steps_s": direct_s,
            "link_only_steps_s": link_s, "exposed_s": statistics.median(exposed),
            "exposed_fraction": statistics.median(e / w for e, w in zip(exposed, wan_s, strict=True)),
            "compute_s": statistics.median(max(x["compute_s"] for x in m) for m in wan),
            "wait_s": statistics.median(max(x["wait_s"] for x in m) for m in wan),
            "kv_bytes": sum(x["sent_bytes"].get("kv", 0) for x in wan[0]),
            "dkv_bytes": sum(x["sent_bytes"].get("dkv", 0) for x in wan[0]),
            "loss": sum(x["loss"] for x in wan[0]),
        }
    dense = rows.get("dense")
    for row in rows.values():
        row["speedup_vs_dense"] = dense["wan_step_s"] / row["wan_step_s"] if dense else None
        row["link_only_speedup_vs_dense"] = dense["link_only_s"] / row["link_only_s"] if dense else None
    return rows


def _step_s(members: list[dict[str, Any]]) -> float:
    return max(m["end"] for m in members) - min(m["start"] for m in members)


def render(rows: dict[str, dict[str, Any]], settings: dict[str, Any]) -> str:
    header = ["coding", "K/V bytes / step (fwd + bwd)", "wan step s", "direct step s", "exposed comm s",
              "exposed / step", "busiest member compute s", "wan speed-up vs dense", "link only s (no compute)",
              "link-only speed-up vs dense"]
    lines = []
    for label, row in rows.items():
        total = row["kv_bytes"] + row["dkv_bytes"]
        speedup = "" if row["speedup_vs_dense"] is None else f"{row['speedup_vs_dense']:.2f}x"
        link = "" if row["link_only_speedup_vs_dense"] is None else f"{row['link_only_speedup_vs_dense']:.2f}x"
        lines.append([label, f"{total / MB:.2f} MB", f"{row['wan_step_s']:.2f}", f"{row['direct_step_s']:.2f}",
                      f"{row['exposed_s']:.2f}", f"{100 * row['exposed_fraction']:.0f}%", f"{row['compute_s']:.2f}",
                      speedup, f"{row['link_only_s']:.3f}", link])
    link = f"{settings['mbit_per_s']:g} Mbit/s, {settings['latency_ms']:g} ms one way"
    return f"Link: {link}; batch {settings['batch_size']} x 2048 bytes over {CHUNKS} members.\n\n" + \
        markdown_table(header, lines)


def verdicts(rows: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for label, row in rows.items():
        if label == "dense":
            continue
        exposed_ok = row["exposed_fraction"] <= TARGET_EXPOSED
        speed_ok = row["speedup_vs_dense"] is not None and row["speedup_vs_dense"] >= TARGET_SPEEDUP
        out.append(f"{label}: exposed communication {100 * row['exposed_fraction']:.0f}% of the step "
                   f"(target <= {100 * TARGET_EXPOSED:.0f}%: {'pass' if exposed_ok else 'FAIL'}); "
                   f"{row['speedup_vs_dense']:.2f}x faster than dense (target >= {TARGET_SPEEDUP:g}x: "
                   f"{'pass' if speed_ok else 'FAIL'})")
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    before = machine()
    result = run(args)
    rows = summarise(result)
    table = render(rows, result["settings"])
    lines = verdicts(rows)
    print(table)
    print("\n".join(lines))
    print(f"load average before {before['load_average']}, after {load_average_text()}")
    write_result(args.json, {"rows": rows, "verdicts": lines, **result}, before=before)


if __name__ == "__main__":
    main()
