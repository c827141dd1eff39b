"""Share generation throughput against the raw ChaCha20 keystream it consumes, in MB/s of
keystream-equivalent bytes (8 per element); target ``share_float / raw_keystream`` >= 0.5::

    .venv/bin/python scripts/bench/sharing.py [--numel 4194304] [--repeats 7]
        [--json scripts/bench/results/sharing.json]"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gossamer.crypto.sharing import MaskStream, encode, reconstruct, share_float
from gossamer_harness.report import MB, machine, markdown_table, write_result

_HERE = Path(__file__).resolve().parent

RAW = "raw_keystream"
SHARE = "share_float"
MIN_RATIO = 0.5
LABELS = {
    RAW: "raw ChaCha20 keystream (`MaskStream.raw_bytes`, 8 bytes per element)",
    "ring": "diagnostic: masks as an int64 tensor (`MaskStream.ring`)",
    "encode": "diagnostic: fixed-point encoding with range check (`encode`, float32 in)",
    SHARE: "`share_float` of a float32 tensor (both shares)",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numel", type=int, default=4 * 1024 * 1024, help="float32 values shared per repetition")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=_HERE / "results" / "sharing.json")
    return parser.parse_args(argv)


def build_rows(numel: int) -> dict[str, Callable[[], Any]]:
    """The timed calls; each row draws from its own fresh (os.urandom-keyed) stream."""
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0)) * 100
    streams = {name: MaskStream() for name in LABELS}
    return {
        RAW: lambda: streams[RAW].raw_bytes(8 * numel),
        "ring": lambda: streams["ring"].ring((numel,)),
        "encode": lambda: encode(x),
        SHARE: lambda: share_float(x, streams[SHARE]),
    }


def check_correct(numel: int) -> None:
    """The timed share_float really shares: the shares reconstruct to the encoding."""
    x = torch.randn(numel, generator=torch.Generator().manual_seed(1))
    s0, s1 = share_float(x, MaskStream())
    if not torch.equal(reconstruct(s0, s1), encode(x)):
        raise RuntimeError("share_float shares do not reconstruct to encode(x)")


def run_interleaved(rows: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds per repetition of every row; repetition 0 is an untimed warm-up, the order rotates."""
    names = list(rows)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats + 1):
        print(f"repetition {rep}" + (" (warm-up)" if rep == 0 else ""), file=sys.stderr, flush=True)
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            start = time.perf_counter()
            result = rows[name]()
            elapsed = time.perf_counter() - start
            del result
            if rep > 0:
                seconds[name].append(elapsed)
    return seconds


def summarize(seconds: dict[str, list[float]], numel: int) -> dict[str, dict[str, Any]]:
    """Median / min / max keystream-equivalent MB/s per row, and each row's ratio to the raw keystream."""
    size_bytes = 8 * numel
    raw = seconds[RAW]
    out: dict[str, dict[str, Any]] = {}
    for name, times in seconds.items():
        rates = [size_bytes / MB / t for t in times]
        out[name] = {"seconds": times, "mb_per_s": rates, "median_mb_per_s": statistics.median(rates),
                     "min_mb_per_s": min(rates), "max_mb_per_s": max(rates),
                     "ratio_to_raw": statistics.median(raw) / statistics.median(times),
                     "paired_ratio_to_raw": statistics.median(r / t for r, t in zip(raw, times, strict=True))}
    share = out[SHARE]
    share["output_mb_per_s_both_shares"] = 2 * share["median_mb_per_s"]
    share["min_ratio"] = MIN_RATIO
    share["pass"] = share["ratio_to_raw"] >= MIN_RATIO
    return out


def render(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    header = ["row", "median MB/s", "min - max MB/s", "vs raw keystream", "paired"]
    lines = []
    for name, row in rows.items():
        verdict = ""
        if name == SHARE:
            verdict = f" (>= {MIN_RATIO:g}: " + ("pass" if row["pass"] else "**FAIL**") + ")"
        lines.append([LABELS[name], f"{row['median_mb_per_s']:.0f}",
                      f"{row['min_mb_per_s']:.0f} - {row['max_mb_per_s']:.0f}",
                      f"{row['ratio_to_raw']:.2f}{verdict}", f"{row['paired_ratio_to_raw']:.2f}"])
    caption = (f"{args.numel:,} elements = {8 * args.numel / MB:g} MB of keystream per repetition "
               f"(MB/s counts 8 bytes per element; share_float writes twice that, both shares), "
               f"torch threads = {torch.get_num_threads()}, median of {args.repeats} interleaved repetitions")
    return caption + "\n\n" + markdown_table(header, lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    check_correct(min(args.numel, 1 << 16))
    before = machine()
    rows = summarize(run_interleaved(build_rows(args.numel), args.repeats), args.numel)
    table = render(rows, args)
    print(table)
    write_result(args.json, {"min_ratio": MIN_RATIO, "rows": rows, "table_markdown": table}, before=before, args=args)
    print(f"\nwrote {args.json}", file=sys.stderr)
    return 0 if rows[SHARE]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
