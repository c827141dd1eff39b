"""Summaries, tables and the plot of ``diloco_variants.py``: each arm's gap to DiLoCo of the same
text and seed, its slope and worst value, and the consensus distance (definitions: ``_arm_summary``)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from _diloco_cost import LINKS_MBIT, MODELLED_H, MODELLED_STEP_S, RTT_S

from gossamer_harness.report import figure, markdown_table

TARGET_GAP_PCT = 3.0
WINDOW = 20
LAST = 10
PERIOD = 5
STAGE_ROWS = (("x", "x start"), ("m", "after W1"), ("x_next", "after step"), ("u", "u start"),
              ("u_mixed", "u after W1"), ("d", "d"), ("d_mixed", "d after W2"))


def _mean_curve(run: dict) -> list[float]:
    return [sum(r["heldout"]) / len(r["heldout"]) for r in run["rounds"]]


def _slope(values: list[float]) -> float:
    """Least-squares slope per step."""
    xs = range(len(values))
    mx, my = statistics.fmean(xs), statistics.fmean(values)
    return sum((x - mx) * (y - my) for x, y in zip(xs, values, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _cd(run: dict, stage: str = "x_next") -> list[float]:
    return [r["stages"].get(stage, {}).get("cd", {}).get("all", 0.0) for r in run["rounds"]]


def _arm_summary(runs: list[dict], diloco: dict[int, dict]) -> dict[str, Any]:
    """Gap to DiLoCo = (held-out loss of the arm - DiLoCo's) / DiLoCo's per round ("mean of replicas":
    what each learner holds; "replicas' average": what a run could publish); its slope is a
    least-squares line over the last ``WINDOW`` rounds (points per 10 rounds), the worst gap the
    largest of the last ``LAST``, the mean gap over the window and over each ``PERIOD``; consensus
    distance of the parameters after the outer step (``protocols.core.consensus``), all parameters."""
    per_seed = []
    for run in runs:
        base = _mean_curve(diloco[run["seed"]])
        curve, avg = _mean_curve(run), [r["heldout_of_average"] for r in run["rounds"]]
        gap = [100 * (c - b) / b for c, b in zip(curve, base, strict=True)]
        per_seed.append({
            "seed": run["seed"], "curve": curve, "gap_pct": gap,
            "avg_gap_pct": [100 * (a - b) / b for a, b in zip(avg, base, strict=True)],
            "slope_pct_per_10": 10 * _slope(gap[-WINDOW:]) if len(gap) >= 3 else 0.0,
            "period_gap_pct": [statistics.fmean(gap[i:i + PERIOD]) for i in range(0, len(gap), PERIOD)],
            "spread": [max(r["heldout"]) - min(r["heldout"]) for r in run["rounds"]], "cd": _cd(run)})
    final = [s["curve"][-1] for s in per_seed]
    gaps = [s["gap_pct"][-1] for s in per_seed]
    slopes = [s["slope_pct_per_10"] for s in per_seed]
    window = min(WINDOW, len(per_seed[0]["cd"]) - 1)
    return {
        "final_mean": statistics.fmean(final), "final_sd": statistics.stdev(final) if len(final) > 1 else 0.0,
        "gap_pct": statistics.fmean(gaps), "gap_pct_range": (min(gaps), max(gaps)),
        "avg_gap_pct": statistics.fmean(s["avg_gap_pct"][-1] for s in per_seed),
        "worst_gap_pct": statistics.fmean(max(s["gap_pct"][-LAST:]) for s in per_seed),
        "mean_gap_window_pct": statistics.fmean(statistics.fmean(s["gap_pct"][-WINDOW:]) for s in per_seed),
        "slope_pct_per_10": statistics.fmean(slopes), "slope_range": (min(slopes), max(slopes)),
        "spread_final": statistics.fmean(s["spread"][-1] for s in per_seed),
        "cd_before_window": statistics.fmean(s["cd"][-1 - window] for s in per_seed),
        "cd_final": statistics.fmean(s["cd"][-1] for s in per_seed),
        "cd_max_window": max(max(s["cd"][-window:]) for s in per_seed),
        "meets_target": max(gaps) <= TARGET_GAP_PCT and statistics.fmean(slopes) <= 0.0,
        "per_seed": per_seed}


def summarise(runs: list[dict], *, arms: list, sources: list[str], seeds: list[int], costs: dict) -> dict:
    summary: dict[str, dict] = {}
    for source in sources:
        diloco = {r["seed"]: r for r in runs if r["source"] == source and r["arm"] == "diloco"}
        summary[source] = {}
        for arm in arms:
            mine = [r for r in runs if r["source"] == source and r["arm"] == arm.key and r["seed"] in seeds]
            if not mine:
                continue
            ran = sorted(r["seed"] for r in mine)
            label = arm.label if ran == sorted(seeds) else f"{arm.label} [seeds {', '.join(map(str, ran))} only]"
            summary[source][arm.key] = {"label": label, "seeds": ran, **_arm_summary(mine, diloco),
                                        "cost": costs[arm.key]}
    return {"summary": summary}


def _stage_table(runs: list[dict], source: str, arms: list, seed: int, rounds: list[int]) -> str:
    headers = ["arm", "round"] + [f"CD {label}" for _, label in STAGE_ROWS] + ["mean abs u", "abs mean u",
                                                                              "mean abs d", "abs mean d"]
    rows = []
    for arm in arms:
        run = next((r for r in runs if r["source"] == source and r["arm"] == arm.key and r["seed"] == seed), None)
        if run is None or not run["rounds"][0]["stages"]:
            continue
        for t in rounds:
            st = run["rounds"][t - 1]["stages"]
            rows.append([arm.key, t] + [f"{st[k]['cd']['all']:.3g}" for k, _ in STAGE_ROWS]
                        + [f"{st[k][n]:.3g}" for k in ("u", "d") for n in ("mean_norm", "norm_of_mean")])
    return markdown_table(headers, rows)


def render(payload: dict, arms: list) -> str:
    s, summary = payload["settings"], payload["summary"]
    rounds = s["rounds"]
    parts = [f"Settings: {s} (seed and source vary: seeds {payload['seeds']}, texts {payload['sources']})",
             "Contraction factor ||W - J||_2 of the topologies for n = 8 (one round; per-round geometric "
             "mean over the run's rounds):",
             markdown_table(["topology", "one round", "per round over the run"],
                            [[k, f"{v['one_round']:.3f}", f"{v['per_round_over_rounds']:.3f}"]
                             for k, v in payload["contraction"].items()])]
    for source, by_arm in summary.items():
        parts.append(f"**{source}**: round {rounds}, mean (sd) over seeds; gap to DiLoCo of the same seed; slope of "
                     f"that gap over the last {WINDOW} rounds; CD = consensus distance after the step:")
        parts.append(markdown_table(
            ["arm", "held-out loss, mean of replicas", "gap (seeds min..max)", f"worst gap, last {LAST} rounds",
             f"mean gap, last {WINDOW} rounds", "gap of replicas' average",
             "gap slope, pts / 10 rounds", "replica spread", f"CD round {rounds - WINDOW} -> {rounds}",
             "KB / round / learner", f"util 100 Mbit/s (150M, H={MODELLED_H})", "target"],
            [[r["label"], f"{r['final_mean']:.4f} ({r['final_sd']:.4f})",
              f"{r['gap_pct']:+.2f}% ({r['gap_pct_range'][0]:+.2f}..{r['gap_pct_range'][1]:+.2f})",
              f"{r['worst_gap_pct']:+.2f}%", f"{r['mean_gap_window_pct']:+.2f}%", f"{r['avg_gap_pct']:+.2f}%", f"{r['slope_pct_per_10']:+.2f} ({r['slope_range'][0]:+.2f}..{r['slope_range'][1]:+.2f})",
              f"{r['spread_final']:.3f}", f"{r['cd_before_window']:.3g} -> {r['cd_final']:.3g}",
              f"{r['cost']['measured']['bytes_per_round'] / 1e3:.0f}",
              f"{100 * r['cost']['modelled_H500']['util_100mbit']:.1f}%",
              "-" if key == "diloco" else ("meets" if r["meets_target"] else "misses")]
             for key, r in by_arm.items()]))
        checkpoints = sorted({t for t in (1, 5, 10, 20, 40, rounds) if t <= rounds})
        parts.append(f"Stages of the round, seed {payload['seeds'][0]} (CD of x, momentum u and pseudo-gradient d, "
                     "all parameters; norms are the mean of the replicas' norms and the norm of their mean):")
        parts.append(_stage_table(payload["runs"], source, arms, payload["seeds"][0], checkpoints))
        every = max(1, rounds // 12)
        marks = list(range(every, rounds + 1, every))
        parts.append("Gap to DiLoCo per round (mean over seeds, % of DiLoCo's held-out loss):")
        parts.append(markdown_table(["arm"] + [str(t) for t in marks], [
            [r["label"]] + [f"{statistics.fmean(p['gap_pct'][t - 1] for p in r['per_seed']):+.1f}" for t in marks]
            for key, r in by_arm.items() if key != "diloco"]))
        periods = range(0, rounds, PERIOD)
        parts.append(f"Gap to DiLoCo averaged over each {PERIOD} rounds (mean over seeds, %):")
        parts.append(markdown_table(["arm"] + [f"{t + 1}-{min(t + PERIOD, rounds)}" for t in periods], [
            [r["label"]] + [f"{statistics.fmean(p['period_gap_pct'][i] for p in r['per_seed']):+.1f}"
                            for i in range(len(periods))]
            for key, r in by_arm.items() if key != "diloco"]))
    first = next(iter(summary.values()))
    util_headers = ["arm"] + [f"{case} {m} Mbit/s" for case in ("measured", f"modelled H={s['inner_steps']}",
                                                              f"modelled H={MODELLED_H}") for m in LINKS_MBIT]
    parts.append(f"Compute utilisation (compute / wall), RTT {RTT_S * 1000:.0f} ms per exchange. measured: tiny model, "
                 f"measured inner step {1000 * payload['step_s']:.1f} ms. modelled: {payload['modelled_params'] / 1e6:.0f}M-"
                 f"parameter ByteTransformer {payload['modelled_config']}, fp32, ASSUMED inner step {MODELLED_STEP_S} s:")
    parts.append(markdown_table(util_headers, [
        [r["label"]] + [f"{100 * r['cost'][c][f'util_{m}mbit']:.1f}%" for c in ("measured", "modelled_H", "modelled_H500")
                        for m in LINKS_MBIT] for r in first.values()]))
    return "\n\n".join(parts)


def plot(payload: dict, path: Path) -> None:
    """Per text: held-out loss, gap to DiLoCo and consensus distance per round (mean over seeds,
    band = min..max over seeds); one colour per arm, in the order the arms ran."""
    summary = payload["summary"]
    keys = list(dict.fromkeys(key for by_arm in summary.values() for key in by_arm))
    colours = {key: f"C{i}" for i, key in enumerate(keys)}
    with figure(path, nrows=len(summary), ncols=3, figsize=(17, 4.6 * len(summary)), squeeze=False) as (_, axes):
        for row, (source, by_arm) in zip(axes, summary.items(), strict=True):
            for key, r in by_arm.items():
                style = {"label": key, "color": colours[key], "linestyle": "--" if "private" in key else "-"}
                for ax, field in zip(row, ("curve", "gap_pct", "cd"), strict=True):
                    if field != "curve" and key == "diloco":
                        continue
                    series = [p[field] for p in r["per_seed"]]
                    xs = range(1, len(series[0]) + 1)
                    ax.plot(xs, [statistics.fmean(v) for v in zip(*series, strict=True)], **style)
                    ax.fill_between(xs, [min(v) for v in zip(*series, strict=True)],
                                    [max(v) for v in zip(*series, strict=True)], color=colours[key], alpha=0.15)
            titles = ("held-out loss (mean of replicas)", "gap to DiLoCo (%)", "consensus distance after the step")
            for ax, title in zip(row, titles, strict=True):
                ax.set_title(f"{source.split('/')[0]}: {title}", fontsize=10)
                ax.set_xlabel("round")
                ax.grid(alpha=0.3)
            row[1].axhline(TARGET_GAP_PCT, color="black", linewidth=0.8, linestyle=":")
            row[2].set_yscale("log")
            row[0].legend(fontsize=7)
