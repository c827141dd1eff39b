"""Ratios of the transport benchmark against its targets, and its Markdown table."""

from __future__ import annotations

import statistics
from typing import Any

from gossamer_harness.report import MB, markdown_table

LINK = "link"
"""Denominator name of the WAN rows: the emulated link's rate."""

TARGETS: dict[str, dict[str, Any]] = {
    "tcp_vs_raw": {"row": "tcp", "against": "raw", "min_ratio": 0.70},
    "http_vs_raw": {"row": "http", "against": "raw", "min_ratio": 0.25},
    "tcp_vs_hivemind": {"row": "tcp", "against": "hivemind", "min_ratio": 10.0},
    "http_vs_hivemind": {"row": "http", "against": "hivemind", "min_ratio": 10.0},
    "tcp_wan_vs_link": {"row": "tcp_wan", "against": LINK, "min_ratio": 0.90},
    "http_wan_vs_link": {"row": "http_wan", "against": LINK, "min_ratio": 0.90},
    "tcp_fresh_vs_raw": {"row": "tcp_fresh", "against": "raw", "min_ratio": None},
    "tcp_fresh_vs_hivemind": {"row": "tcp_fresh", "against": "hivemind", "min_ratio": None},
}
"""Each ratio is median MB/s of ``row`` over median MB/s of ``against`` (or the link rate); the
JSON also holds the paired ratio, the median of per-repetition ratios. ``min_ratio`` None: the
ratio is reported without a target."""

LABELS = {
    "raw": "raw Python socket (`sendall` / `recv_into`)",
    "tcp": "gossamer TCP (REQUEST frame, tensor codec, received into a preallocated destination via `payload_buffer`)",
    "tcp_fresh": "diagnostic: gossamer TCP, a fresh receive buffer allocated per frame",
    "http": "gossamer HTTP (PUT safetensors)",
    "hivemind": "hivemind `DecentralizedAverager`, 2 peers (payload / step time)",
    "tcp_wan": "gossamer TCP via WAN proxy",
    "http_wan": "gossamer HTTP via WAN proxy",
}
COLUMNS = {"raw": "vs raw socket", "hivemind": "vs hivemind", LINK: "vs link"}


def compute_ratios(rows: dict[str, Any], link_mb_per_s: float) -> dict[str, dict[str, Any]]:
    """Every target whose two sides were measured: the ratio and whether it meets the target."""
    ratios: dict[str, dict[str, Any]] = {}
    for key, target in TARGETS.items():
        row, against = target["row"], target["against"]
        if row not in rows or (against != LINK and against not in rows):
            continue
        base = link_mb_per_s if against == LINK else rows[against]["median_mb_per_s"]
        ratio = rows[row]["median_mb_per_s"] / base
        passed = None if target["min_ratio"] is None else ratio >= target["min_ratio"]
        ratios[key] = {**target, "ratio": ratio, "pass": passed,
                       "paired_median_ratio": _paired(rows[row], rows.get(against))}
    return ratios


def _paired(row: dict[str, Any], against: dict[str, Any] | None) -> float | None:
    """Median over repetitions k of row_k / against_k (interleaved, so k ran under like load)."""
    if against is None or len(row["mb_per_s"]) != len(against["mb_per_s"]):
        return None
    return statistics.median(a / b for a, b in zip(row["mb_per_s"], against["mb_per_s"], strict=True))


def _ratio_cell(ratio: dict[str, Any]) -> str:
    times = ratio["against"] == "hivemind"
    value = f"{ratio['ratio']:.1f}x" if times else f"{100 * ratio['ratio']:.0f}%"
    if ratio["min_ratio"] is None:
        return f"{value} (no target)"
    verdict = "pass" if ratio["pass"] else "**FAIL**"
    goal = f"{ratio['min_ratio']:g}x" if times else f"{100 * ratio['min_ratio']:.0f}%"
    return f"{value} (>= {goal}: {verdict})"


def _row_cells(name: str, row: dict[str, Any], ratios: dict[str, dict[str, Any]]) -> list[str]:
    payload = f"{row['payload_bytes'] / MB:g} MB x {row['repeats']}"
    cells = [LABELS[name], payload, f"{row['median_mb_per_s']:.1f}",
             f"{row['min_mb_per_s']:.1f} - {row['max_mb_per_s']:.1f}"]
    for against in COLUMNS:
        found = [ratio for ratio in ratios.values() if ratio["row"] == name and ratio["against"] == against]
        cells.append(_ratio_cell(found[0]) if found else "")
    return cells


def render_table(rows: dict[str, Any], ratios: dict[str, dict[str, Any]], link: dict[str, Any]) -> str:
    """The markdown table: one line per row, ratios in the columns of their denominators."""
    header = ["transfer", "payload x reps", "median MB/s", "min - max MB/s",
              *(COLUMNS[key] if key != LINK else f"vs link ({link['mbit_per_s']:g} Mbit/s = "
                f"{link['rate_mb_per_s']:g} MB/s, {link['latency_ms']:g} ms one way)" for key in COLUMNS)]
    lines = [_row_cells(name, row, ratios) for name, row in rows.items()]
    return markdown_table(header, lines)
