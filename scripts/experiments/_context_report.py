"""Tables, the equal-wall-clock comparison and the figure of ``context.py``'s results."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

from gossamer_harness.report import MB, figure, markdown_table


def _curve(arm: dict[str, Any], comm_key: str) -> list[tuple[float, float]]:
    """(emulated seconds after the evaluated step, held-out loss) at every evaluation."""
    elapsed, times = 0.0, [0.0]
    for record in arm["steps"]:
        elapsed += record["compute_s"] + record[comm_key]
        times.append(elapsed)
    return [(times[e["step"]], e["loss"]) for e in arm["evals"]]


def _at(curve: list[tuple[float, float]], when: float) -> float:
    """The loss at ``when``, linear between evaluations."""
    for (t0, l0), (t1, l1) in itertools.pairwise(curve):
        if t0 <= when <= t1:
            return l0 + (l1 - l0) * (when - t0) / (t1 - t0) if t1 > t0 else l1
    return curve[-1][1]


def equal_time_losses(result: dict[str, Any]) -> dict[str, Any]:
    """Every arm's held-out loss when the fastest arm (emulated WAN clock) has finished its steps;
    dense over plain loopback (no emulated link) beside it."""
    curves = {label: _curve(arm, "comm_wan_s") for label, arm in result["arms"].items()}
    budget = min(curve[-1][0] for curve in curves.values())
    out: dict[str, Any] = {"budget_s": budget, "arms": {}}
    for label, arm in result["arms"].items():
        clock, steps = 0.0, 0
        for record in arm["steps"]:
            clock += record["compute_s"] + record["comm_wan_s"]
            steps += clock <= budget
        out["arms"][label] = {"loss": _at(curves[label], budget), "steps": steps}
    if "dense" in result["arms"]:
        loopback = _curve(result["arms"]["dense"], "comm_direct_s")
        out["dense_loopback"] = {"loss": _at(loopback, budget), "curve": loopback}
    out["curves"] = curves
    return out


def _paired(arm: list[float], dense: list[float]) -> str:
    diffs = [a - d for a, d in zip(arm, dense, strict=True)]
    if len(diffs) < 2:
        return f"{diffs[0]:+.3f}"
    se = statistics.stdev(diffs) / len(diffs) ** 0.5
    return f"{statistics.fmean(diffs):+.3f} +- {2 * se:.3f}"


def render_tables(result: dict[str, Any]) -> str:
    arms, settings = result["arms"], result["settings"]
    dense = arms.get("dense")
    dense_bytes = None if dense is None else dense["steps"][0]["kv_bytes"] + dense["steps"][0]["dkv_bytes"]
    rows = []
    for label, arm in arms.items():
        steps = arm["steps"]
        sent = steps[0]["kv_bytes"] + steps[0]["dkv_bytes"]
        fewer = "" if dense_bytes is None else f"{100 * (1 - sent / dense_bytes):.2f}%"
        final = statistics.fmean(arm["final_window_losses"])
        diff = "" if dense is None or label == "dense" else _paired(arm["final_window_losses"],
                                                                     dense["final_window_losses"])
        compute = statistics.median(r["compute_s"] for r in steps)
        wan = statistics.median(r["comm_wan_s"] for r in steps)
        rows.append([label, f"{sent / MB:.3f}", fewer, f"{final:.3f}", diff, f"{compute:.2f}", f"{wan:.3f}",
                     f"{statistics.median(r['comm_direct_s'] for r in steps):.3f}", f"{compute + wan:.2f}"])
    head = ["arm", "K/V MB / step", "fewer bytes than dense", f"held-out loss after {settings['steps']} steps",
            "minus dense (+- 2 SE, paired windows)", "busiest member compute s / step",
            f"comm s / step, {settings['mbit']:g} Mbit/s {settings['latency_ms']:g} ms", "comm s / step, loopback",
            "emulated s / step"]
    equal = result["equal_time"]
    time_rows = [[label, str(v["steps"]), f"{v['loss']:.3f}"] for label, v in equal["arms"].items()]
    if "dense_loopback" in equal:
        time_rows.append(["dense, loopback links (no emulated WAN)", "",
                          f"{equal['dense_loopback']['loss']:.3f}"])
    load = result.get("load_average")
    return "\n\n".join([
        f"Equal steps ({settings['steps']} steps of {settings['batch_size']} x 2048 bytes; final loss on "
        f"{settings['final_windows']} held-out windows):",
        markdown_table(head, rows),
        f"Equal emulated wall-clock ({equal['budget_s']:.0f} s = when the fastest arm finished):",
        markdown_table(["arm", "steps done", "held-out loss"], time_rows),
        f"Loss in nats per byte: untrained {result['initial_nats']:.3f}, unigram baseline "
        f"{result['unigram_nats']:.3f}. {result['minutes']:.1f} minutes"
        + (f", load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the end" if load else "") + ".",
    ])


def plot(result: dict[str, Any], path: Path) -> None:
    """Held-out loss against steps and against emulated wall-clock, one line per arm."""
    with figure(path, ncols=2, figsize=(11, 4.2)) as (_, (by_step, by_time)):
        equal = result["equal_time"]
        for label, arm in result["arms"].items():
            by_step.plot([e["step"] for e in arm["evals"]], [e["loss"] for e in arm["evals"]], label=label)
            curve = equal["curves"][label]
            by_time.plot([t for t, _ in curve], [loss for _, loss in curve], label=label)
        if "dense_loopback" in equal:
            curve = equal["dense_loopback"]["curve"]
            by_time.plot([t for t, _ in curve], [loss for _, loss in curve], "k:", label="dense, loopback")
        by_time.axvline(equal["budget_s"], color="grey", linewidth=0.8)
        settings = result["settings"]
        by_step.set(xlabel="step", ylabel="held-out loss (nats / byte)", title="equal steps")
        by_time.set(xlabel=f"emulated seconds ({settings['mbit']:g} Mbit/s, {settings['latency_ms']:g} ms)",
                    title="equal wall-clock (compute + measured link time)")
        for axes in (by_step, by_time):
            axes.axhline(result["unigram_nats"], color="grey", linestyle="--", linewidth=0.8)
            axes.legend()
