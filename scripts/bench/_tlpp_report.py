"""Summaries and markdown tables of the TL++ step benchmark: medians per part, the secure/base
ratio and the share-generation ratios against their targets, the phase table, the loop profile."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import sharing as sharing_bench
import torch
from _tlpp_network import MODES, NUM_NODES

from gossamer_harness.report import MB, markdown_table

MAX_STEP_RATIO = 1.5
MIN_SHARE_RATIO = sharing_bench.MIN_RATIO
PARTS = ("compute", "share_gen", "transfer")
PARTIES = ("node", "helper", "orchestrator")
PHASES = ("forward", "share:act", "logits", "backward", "share:grad", "sum", "orchestrator_local")
"""Request labels of the phase table, in step order; the node-to-helper pushes ("share:...") lie
inside the forward / backward requests that trigger them."""



def summarize_mode(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per part; transfer is computed per repetition (whole - compute - share generation)."""
    whole = [r["seconds"] for r in reps]
    share_gen = [r["split"].get("share", 0.0) + r["split"].get("reconstruct", 0.0) for r in reps]
    compute = [sum(r["split"].get(p, 0.0) for p in PARTIES) - s
               for r, s in zip(reps, share_gen, strict=True)]
    transfer = [w - c - s for w, c, s in zip(whole, compute, share_gen, strict=True)]
    parties = {p: statistics.median(r["split"].get(p, 0.0) for r in reps) for p in PARTIES}
    return {
        "whole_s": statistics.median(whole), "whole_min_s": min(whole), "whole_max_s": max(whole),
        "compute_s": statistics.median(compute), "share_gen_s": statistics.median(share_gen),
        "share_s": statistics.median(r["split"].get("share", 0.0) for r in reps),
        "reconstruct_s": statistics.median(r["split"].get("reconstruct", 0.0) for r in reps),
        "transfer_s": statistics.median(transfer), "party_split_s": parties,
        "bytes_per_step": statistics.median(r["bytes"] for r in reps),
        "bytes_by_op": reps[-1]["bytes_by_op"],
        "requests_per_step": statistics.median(r["requests"] for r in reps),
        "shared_elements_per_step": sum(reps[-1]["shared_numels"]),
        "shared_tensors_per_step": len(reps[-1]["shared_numels"]), "seconds": whole,
        "loop_cpu_s": statistics.median(r["loop_cpu_s"] for r in reps),
        "worker_cpu_s": statistics.median(r["worker_cpu_s"] for r in reps),
        "phases_s": {label: statistics.median(r["phases"].get(label, 0.0) for r in reps)
                     for label in PHASES},
    }


def summarize(measured: dict[str, Any], bulk: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows = {mode: summarize_mode(measured["reps"][mode]) for mode in MODES}
    base, secure = measured["reps"]["base"], measured["reps"]["secure"]
    ratio = rows["secure"]["whole_s"] / rows["base"]["whole_s"]
    paired = statistics.median(s["seconds"] / b["seconds"] for s, b in zip(secure, base, strict=True))
    loss_gap = max(abs(s["loss"] - b["loss"]) for s, b in zip(secure, base, strict=True))
    step_share = [r["split"]["share"] for r in secure]
    share_mb, raw_s = 8 * rows["secure"]["shared_elements_per_step"] / MB, measured["raw_step_keystream_s"]
    return {
        "rows": rows,
        "step_ratio": {"ratio": ratio, "paired_median_ratio": paired, "max_ratio": MAX_STEP_RATIO,
                       "pass": ratio <= MAX_STEP_RATIO, "loss_max_abs_diff": loss_gap},
        "share_gen": {"bulk_ratio": bulk[sharing_bench.SHARE]["ratio_to_raw"], "min_ratio": MIN_SHARE_RATIO,
                      "pass": bulk[sharing_bench.SHARE]["pass"],
                      "bulk_share_mb_per_s": bulk[sharing_bench.SHARE]["median_mb_per_s"],
                      "bulk_raw_mb_per_s": bulk[sharing_bench.RAW]["median_mb_per_s"],
                      "in_step_ratio": statistics.median(raw_s) / statistics.median(step_share),
                      "in_step_share_mb_per_s": share_mb / statistics.median(step_share),
                      "in_step_raw_mb_per_s": share_mb / statistics.median(raw_s)},
        "bulk_rows": bulk,
        "ping_rtt_s": statistics.median(measured["ping_rtt_s"]),
        "loop_profiles": measured["profiles"],
    }


def _verdict(passed: bool) -> str:
    return "pass" if passed else "**FAIL**"


def render(summary: dict[str, Any], args: argparse.Namespace) -> str:
    rows, step, share = summary["rows"], summary["step_ratio"], summary["share_gen"]
    header = ["mode", "whole step ms (min - max)", "compute ms", "share gen ms", "transfer ms",
              "bytes / step", "requests / step"]
    lines = []
    for mode, row in rows.items():
        lines.append([mode, f"{1e3 * row['whole_s']:.1f} ({1e3 * row['whole_min_s']:.1f} - "
                      f"{1e3 * row['whole_max_s']:.1f})", f"{1e3 * row['compute_s']:.1f}",
                      f"{1e3 * row['share_gen_s']:.2f}", f"{1e3 * row['transfer_s']:.1f}",
                      f"{row['bytes_per_step'] / MB:.3f} MB", f"{row['requests_per_step']:g}"])
    delta = {part: rows["secure"][f"{part}_s"] - rows["base"][f"{part}_s"] for part in ("whole", *PARTS)}
    lines.append(["secure - base", *(f"{1e3 * delta[p]:+.1f}" for p in ("whole", *PARTS)),
                  f"{(rows['secure']['bytes_per_step'] - rows['base']['bytes_per_step']) / MB:+.3f} MB",
                  f"{rows['secure']['requests_per_step'] - rows['base']['requests_per_step']:+g}"])
    caption = (f"digits_cnn, cut 3, virtual batch {args.batch_size} over {NUM_NODES} nodes, Adam; median of "
               f"{args.repeats} interleaved steps per mode after {args.warmup} warm-up; torch threads = "
               f"{torch.get_num_threads()}; transfer = whole - compute - share gen (per step, then median)")
    verdicts = (
        f"secure / base step time: {step['ratio']:.2f}x (paired {step['paired_median_ratio']:.2f}x) "
        f"(<= {MAX_STEP_RATIO:g}x: {_verdict(step['pass'])}); |loss secure - loss base| of paired steps <= "
        f"{step['loss_max_abs_diff']:.1e} (the two trained models drift apart under Adam)\n"
        f"share generation vs raw keystream, bulk ({args.share_numel:,} elements): {share['bulk_ratio']:.2f} "
        f"({share['bulk_share_mb_per_s']:.0f} vs {share['bulk_raw_mb_per_s']:.0f} MB/s) "
        f"(>= {MIN_SHARE_RATIO:g}: {_verdict(share['pass'])})\n"
        f"share generation vs raw keystream, the {rows['secure']['shared_tensors_per_step']} tensors of one "
        f"secure step ({rows['secure']['shared_elements_per_step']:,} elements): "
        f"{share['in_step_ratio']:.2f} "
        f"({share['in_step_share_mb_per_s']:.0f} vs {share['in_step_raw_mb_per_s']:.0f} MB/s, no target)")
    return "\n\n".join([caption, markdown_table(header, lines), verdicts, render_phases(summary)])


def render_phases(summary: dict[str, Any]) -> str:
    """Where the network step's wall time goes: each request phase (first start to last end) and the
    CPU of the event-loop thread (all parties' request handling) and of the worker threads (model math)."""
    header = ["mode", *(f"{label} ms" for label in PHASES), "event-loop CPU ms", "worker-thread CPU ms"]
    lines = [[mode, *(f"{1e3 * row['phases_s'][label]:.2f}" if row["phases_s"][label] else ""
                      for label in PHASES),
              f"{1e3 * row['loop_cpu_s']:.1f}", f"{1e3 * row['worker_cpu_s']:.1f}"]
             for mode, row in summary["rows"].items()]
    return ("Phases of the network step (median ms; share:act / share:grad are the nodes' pushes to the "
            "helper, inside forward / backward; orchestrator_local = step time outside the orchestrator's "
            f"requests). Round trip of a ping to the helper (one node, which it sees) over an encrypted link: "
            f"{1e3 * summary['ping_rtt_s']:.2f} ms.\n\n"
            + markdown_table(header, lines) + render_profile(summary))


def render_profile(summary: dict[str, Any]) -> str:
    """The largest self-CPU groups of the event-loop thread per step, per mode (cProfile)."""
    if not summary["loop_profiles"]:
        return ""
    lines = [[mode, row["group"], f"{1e3 * row['cpu_s_per_step']:.2f}", f"{100 * row['share']:.0f}%"]
             for mode, profile in summary["loop_profiles"].items() for row in profile["top_self"][:6]]
    totals = ", ".join(f"{mode} {1e3 * p['profiled_loop_cpu_s_per_step']:.1f} ms"
                       for mode, p in summary["loop_profiles"].items())
    return (f"\n\nEvent-loop thread under cProfile, self CPU (inflated by the profiler; per step: "
            f"{totals})\n\n"
            + markdown_table(["mode", "module / builtin", "self ms / step", "of loop CPU"], lines))
