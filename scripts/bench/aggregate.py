"""Each robust aggregator over n float32 updates as a multiple of one plain mean (the pre-stacked
``stack(updates).mean(0)``: the memory-bandwidth floor), rows interleaved::

    .venv/bin/python scripts/bench/aggregate.py [--num_updates 16] [--numel 10000000] [--f 4]
        [--repeats 5] [--json scripts/bench/results/aggregate.json]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gossamer.protocols.core import robust
from gossamer.protocols.core.robust import Contribution
from gossamer_harness.report import machine, markdown_table, write_result

_HERE = Path(__file__).resolve().parent

FLOOR = "mean_floor"
TARGETS = {"mean": 1.5, "median": 4.0, "trimmed_mean": 4.0, "geometric_median": 8.0, "krum": 8.0, "multi_krum": 8.0,
           "centered_clipping": 8.0, "clipped_gossip": 8.0}
"""Most a row may take, in multiples of the floor: its paired ratio (the median over repetitions
of the row's time over the floor's time in the same repetition)."""
TAU = 1.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_updates", type=int, default=16)
    parser.add_argument("--numel", type=int, default=10_000_000, help="float32 values per update")
    parser.add_argument("--f", type=int, default=4, help="Byzantine budget passed to the robust aggregators")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=_HERE / "results" / "aggregate.json")
    return parser.parse_args(argv)


def build_rows(args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    """The timed calls, the floor first; all over the same seeded updates."""
    generator = torch.Generator().manual_seed(0)
    updates = [torch.randn(args.numel, generator=generator) for _ in range(args.num_updates)]
    stacked = torch.stack(updates)
    cs = [Contribution(f"peer{i:03d}", vector) for i, vector in enumerate(updates)]
    f = args.f
    neighbours = {c.sender: 1.0 / args.num_updates for c in cs[1:]}
    return {
        FLOOR: lambda: stacked.mean(dim=0),
        "mean_floor_one_thread": lambda: _one_thread(lambda: stacked.mean(dim=0)),
        "mean": lambda: robust.mean(cs),
        "median": lambda: robust.coordinate_median(cs, f=f),
        "trimmed_mean": lambda: robust.trimmed_mean(cs, f=f),
        "geometric_median": lambda: robust.geometric_median(cs, f=f),
        "krum": lambda: robust.krum(cs, f=f),
        "multi_krum": lambda: robust.multi_krum(cs, f=f),
        "centered_clipping": lambda: robust.centered_clipping(cs, f=f, tau=TAU, iters=3),
        "clipped_gossip": lambda: robust.clipped_gossip(updates[0], cs[1:], neighbours, tau=TAU),
    }


def _one_thread(step: Callable[[], Any]) -> Any:
    """``step`` with torch's intra-op pool limited to the calling thread, as the kernels run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return step()
    finally:
        torch.set_num_threads(threads)


def run_interleaved(rows: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds per repetition of every row; repetition 0 is an untimed warm-up, the order rotates."""
    names = list(rows)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats + 1):
        print(f"repetition {rep}" + (" (warm-up)" if rep == 0 else ""), file=sys.stderr, flush=True)
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            start = time.perf_counter()
            rows[name]()
            elapsed = time.perf_counter() - start
            if rep > 0:
                seconds[name].append(elapsed)
    return seconds


def summarize(seconds: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Median / min / max seconds, the ratio to the floor, the paired ratio and the target check."""
    floor = seconds[FLOOR]
    out: dict[str, dict[str, Any]] = {}
    for name, times in seconds.items():
        ratio = statistics.median(times) / statistics.median(floor)
        paired = statistics.median(t / b for t, b in zip(times, floor, strict=True))
        target = TARGETS.get(name)
        out[name] = {"seconds": times, "median_s": statistics.median(times), "min_s": min(times),
                     "max_s": max(times), "ratio_to_floor": ratio, "paired_ratio_to_floor": paired,
                     "target_max_ratio": target, "pass": None if target is None else paired <= target}
    return out


def render(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    header = ["aggregator", "median ms", "min - max ms", "x mean floor", "paired x", "target"]
    lines = []
    for name, row in rows.items():
        label = {FLOOR: f"{name} (`stack(updates).mean(0)`, pre-stacked, {torch.get_num_threads()} threads)",
                 "mean_floor_one_thread": f"{name} (the same on 1 thread)"}.get(name, name)
        verdict = "" if row["pass"] is None else f"<= {row['target_max_ratio']:g}x: " + (
            "pass" if row["pass"] else "**FAIL**")
        lines.append([label, f"{1e3 * row['median_s']:.0f}", f"{1e3 * row['min_s']:.0f} - {1e3 * row['max_s']:.0f}",
                      f"{row['ratio_to_floor']:.2f}x", f"{row['paired_ratio_to_floor']:.2f}x", verdict])
    caption = (f"n = {args.num_updates} updates x {args.numel:,} float32, f = {args.f}, tau = {TAU}, "
               f"median of {args.repeats} interleaved repetitions; load average {os.getloadavg()[0]:.1f} at the end")
    return caption + "\n\n" + markdown_table(header, lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    before = machine()
    rows = summarize(run_interleaved(build_rows(args), args.repeats))
    table = render(rows, args)
    print(table)
    write_result(args.json, {"targets": TARGETS, "rows": rows, "table_markdown": table}, before=before, args=args)
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
