"""Summary, Markdown tables and plot of ``wan_training.py``'s measurements (definitions:
docs/BENCHMARKS.md, "Training over emulated WAN links")."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from gossamer_harness.report import figure, markdown_table

LABELS = {"gossamer_diloco": "gossamer DiLoCo (W1 = W2 = global)",
          "gossamer_gossip": "gossamer gossip DiLoCo (g: W1 ring, W2 ring on subset)",
          "gossamer_gossip_avg": "gossamer gossip (g), outer step plain averaging (lr 1, momentum 0)",
          "hivemind_sync": "hivemind.Optimizer, synchronous large batch",
          "hivemind_local": "hivemind.Optimizer, use_local_updates=True"}
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
LINK_WORDS = {"access": "one shared access link per peer", "pair": "each connection shaped on its own (pair links)"}


def curve(peers: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(t, mean over peers of each one's latest sample) at every sample time once all have one: the
    arm's curve; its "final" is its last point within the budget (a hivemind peer's sample after
    its last step past the budget is plotted, not counted)."""
    if not peers or any(not p["samples"] for p in peers):
        return []
    events = sorted((t, i, loss) for i, p in enumerate(peers) for t, loss in p["samples"])
    latest: dict[int, float] = {}
    points = []
    for t, i, loss in events:
        latest[i] = loss
        if len(latest) == len(peers):
            points.append((t, statistics.fmean(latest.values())))
    return points


def value_at(points: list[tuple[float, float]], t: float) -> float | None:
    before = [loss for at, loss in points if at <= t]
    return before[-1] if before else None


def time_to(points: list[tuple[float, float]], loss: float) -> float | None:
    return next((at for at, value in points if value <= loss), None)


def _per_peer(arm: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Utilisation = compute / (wall - evaluation) per peer over what it completed; the blocking
    share is the waits (gossamer: W1 grace + W2; hivemind: the ``opt.step`` calls that start an
    epoch) over the same time."""
    peers = arm["peers"]
    busy = [max(p["wall_s"] - p["eval_s"], 1e-9) for p in peers]
    utilisation = [p["compute_s"] / b if p["wall_s"] else 0.0 for p, b in zip(peers, busy, strict=True)]
    blocking = [p["blocking_s"] / b if p["wall_s"] else 0.0 for p, b in zip(peers, busy, strict=True)]
    gossamer = "rounds" in peers[0]
    steps = [len(p["rounds"]) * settings["inner_steps"] if gossamer else p["steps"] for p in peers]
    return {
        "utilisation": utilisation, "blocking_share": blocking,
        "eval_share": [p["eval_s"] / p["wall_s"] if p["wall_s"] else 0.0 for p in peers],
        "inner_steps": steps,
        "outer_rounds": [len(p["rounds"]) if gossamer else p["epochs"] for p in peers],
        "partial_rounds": sum(p.get("partial_rounds", 0) for p in peers),
        "unbalanced_rounds": sum(p.get("unbalanced_rounds", 0) for p in peers),
        "failure_log_lines": sum(p["failure_log_lines"] for p in peers),
        "nonzero_exits": sum(p["exit_code"] not in (0, None) for p in peers),
        "wire_mb_per_peer": arm["wire_bytes"] / len(peers) / 1e6,
    }


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    settings, arms = report["settings"], report["arms"]
    summary: dict[str, Any] = {}
    for name, arm in arms.items():
        points = curve(arm["peers"])
        in_budget = [(t, loss) for t, loss in points if t <= settings["budget_s"]]
        summary[name] = {
            "curve": points,
            "final_loss": in_budget[-1][1] if in_budget else None,
            "final_at_s": in_budget[-1][0] if in_budget else None,
            "loss_at": {f"{f * settings['budget_s']:g}": value_at(points, f * settings["budget_s"]) for f in FRACTIONS},
            **_per_peer(arm, settings),
        }
    for row in summary.values():
        row["time_to_final_of"] = {other: time_to(row["curve"], summary[other]["final_loss"])
                                   for other in summary if summary[other]["final_loss"] is not None}
    summary["targets"] = _targets(summary)
    return summary


def _targets(summary: dict[str, Any]) -> dict[str, Any]:
    targets: dict[str, Any] = {}
    gossip = summary.get("gossamer_gossip")
    if gossip is None:
        return targets
    for hm in ("hivemind_sync", "hivemind_local"):
        if hm in summary and summary[hm]["final_at_s"]:
            reached = gossip["time_to_final_of"].get(hm)
            ratio = reached / summary[hm]["final_at_s"] if reached is not None else None
            targets[f"gossip time to {hm}'s final loss / {hm}'s time"] = {
                "value": ratio, "target": "<= 0.5", "pass": ratio is not None and ratio <= 0.5}
    util = statistics.fmean(gossip["utilisation"])
    targets["gossip utilisation (mean over peers)"] = {"value": util, "target": ">= 0.9", "pass": util >= 0.9}
    if "gossamer_diloco" in summary:
        diloco = statistics.fmean(summary["gossamer_diloco"]["utilisation"])
        targets["DiLoCo utilisation (mean over peers)"] = {"value": diloco, "target": "< 0.9 (blocking)",
                                                           "pass": diloco < 0.9}
    unbalanced = sum(summary[a]["unbalanced_rounds"] for a in ("gossamer_diloco", "gossamer_gossip") if a in summary)
    targets["gossamer rounds whose ledger does not balance"] = {"value": unbalanced, "target": "0",
                                                                "pass": unbalanced == 0}
    return targets


def _f(value: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def _spread(values: list[float], fmt: str = "{:.0%}") -> str:
    return f"{fmt.format(statistics.fmean(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def render(report: dict[str, Any]) -> str:
    s, summary, arms = report["settings"], report["summary"], report["arms"]
    names = [name for name in arms]
    budgets = list(summary[names[0]]["loss_at"]) if names else []
    header = ["arm", *[f"loss @ {b} s" for b in budgets], "final (at s)",
              *[f"s to {o}'s final" for o in names],
              "utilisation mean (min-max)", "blocking share", "eval share", "inner steps / peer",
              "rounds / epochs", "wire MB / peer", "partial rounds", "failure log lines", "load before / after"]
    rows = []
    for name in names:
        row, arm = summary[name], arms[name]
        rows.append([
            LABELS[name], *[_f(row["loss_at"][b]) for b in budgets],
            f"{_f(row['final_loss'])} ({_f(row['final_at_s'], '{:.0f}')})",
            *[_f(row["time_to_final_of"].get(o), "{:.0f}") for o in names],
            _spread(row["utilisation"]), _spread(row["blocking_share"]), _spread(row["eval_share"]),
            f"{statistics.fmean(row['inner_steps']):.0f}", f"{statistics.fmean(row['outer_rounds']):.1f}",
            f"{row['wire_mb_per_peer']:.0f}", str(row["partial_rounds"]), str(row["failure_log_lines"]),
            f"{arm['load_before'][0]:.1f} / {arm['load_after'][0]:.1f}"])
    intro = (f"{s['peers']} peers, one torch thread each, on {report['machine']['cpu_count']} cores; "
             f"ByteTransformer d_model {s['d_model']}, {s['n_layers']} layers, context {s['context']} "
             f"({report['parameters']:,} parameters, {report['model_mb_fp32']:.1f} MB fp32); batch {s['batch_size']}, "
             f"H = {s['inner_steps']}; links {s['mbit']:g} Mbit/s, {s['latency_ms']:g} ms one way, "
             f"{LINK_WORDS[s.get('link', 'pair')]}; "
             f"{s['budget_s']:g} s per arm. Untrained held-out loss: {report['untrained_loss']:.3f} nats/byte.")
    target_rows = [[name, _f(t["value"], "{:.2f}") if isinstance(t["value"], float) else str(t["value"]),
                    t["target"], "pass" if t["pass"] else "FAIL"] for name, t in summary["targets"].items()]
    return "\n\n".join([intro, markdown_table(header, rows),
                        markdown_table(["target", "measured", "wanted", ""], target_rows) if target_rows else ""])


def plot(report: dict[str, Any], path: Path) -> None:
    """Held-out loss against wall-clock: each peer's samples as dots, the arm's mean curve as a line."""
    with figure(path, figsize=(8, 5)) as (_, ax):
        for index, (name, arm) in enumerate(report["arms"].items()):
            color = f"C{index}"
            for peer in arm["peers"]:
                if peer["samples"]:
                    ts, losses = zip(*peer["samples"], strict=True)
                    ax.plot(ts, losses, ".", color=color, alpha=0.35, markersize=4)
            points = report["summary"][name]["curve"]
            if points:
                ts, losses = zip(*points, strict=True)
                ax.step(ts, losses, where="post", color=color, label=LABELS[name])
        ax.axhline(report["untrained_loss"], color="grey", linestyle="--", linewidth=0.8, label="untrained")
        s = report["settings"]
        ax.set_xlabel("wall-clock seconds since every peer of the arm was up")
        ax.set_ylabel("held-out loss (nats/byte; dots: each peer, line: mean)")
        ax.set_title(f"{s['peers']} peers, {s['mbit']:g} Mbit/s {s.get('link', 'pair')} links, "
                     f"{s['latency_ms']:g} ms, H = {s['inner_steps']} ({report['model_mb_fp32']:.0f} MB model)")
        ax.legend(fontsize=8)
