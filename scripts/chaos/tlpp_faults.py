#!/usr/bin/env python3
"""Fault matrix for TL++ on LocalNet (data nodes, the orchestrator, the helper): every single fault
and every pair (``gossamer_harness.tlpp.fault_runs``), then seeded random chaos, every applied step
rechecked against the protocol (docs/RELIABILITY.md, "Faults survived: TL++")::

    .venv/bin/python scripts/chaos/tlpp_faults.py [--steps 4] [--chaos 12] [--seed N] [--deadline_s 3] [--json PATH]"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import random
import tempfile
from pathlib import Path

from gossamer.protocols.registry import PLUGINS
from gossamer_harness.report import load_average_text, write_result
from gossamer_harness.tlpp.fault_runs import PHASES, Fault, RunShape, identities, reference, run_case
from gossamer_harness.tlpp.recheck import Kept

ROOT = Path(__file__).resolve().parents[2]
MODES = {"base": 3, "secure": 4}  # data nodes


def kinds(peer: str) -> list[str]:
    return list(PHASES["node" if peer.startswith("node") else peer])


def matrix() -> list[tuple[str, list[Fault]]]:
    """Every single fault in step 1, then every pair on two different peers in step 1."""
    cases: list[tuple[str, list[Fault]]] = []
    targets = {"base": ["node2", "orchestrator"], "secure": ["node3", "orchestrator", "helper"]}
    for mode, peers in targets.items():
        cases += [(mode, [(kind, peer, 1)]) for peer in peers for kind in kinds(peer)]
    pairs = {"base": [("node1", "node2"), ("node2", "orchestrator")],
             "secure": [("node2", "node3"), ("node3", "orchestrator"), ("node3", "helper"), ("helper", "orchestrator")]}
    for mode, couples in pairs.items():
        for a, b in couples:
            cases += [(mode, [(ka, a, 1), (kb, b, 1)]) for ka, kb in itertools.product(kinds(a), kinds(b))]
    return cases


def chaos(rng: random.Random, count: int, steps: int) -> list[tuple[str, list[Fault]]]:
    """``count`` cases of one or two random faults on random peers of a random mode."""
    cases = []
    for _ in range(count):
        mode = rng.choice(sorted(MODES))
        peers = [f"node{i}" for i in range(MODES[mode])] + ["orchestrator"] + (["helper"] if mode == "secure" else [])
        chosen = rng.sample(peers, k=rng.choice((1, 2)))
        cases.append((mode, [(rng.choice(kinds(peer)), peer, rng.randrange(steps - 1)) for peer in chosen]))
    return cases


async def main_async(args: argparse.Namespace, seed: int) -> list[dict]:
    cases = [("matrix", mode, faults) for mode, faults in matrix()]
    cases += [("chaos", mode, faults) for mode, faults in chaos(random.Random(seed), args.chaos, args.steps)]
    shapes = {mode: RunShape(mode=mode, nodes=nodes, steps=args.steps, deadline_s=args.deadline_s,
                             slow_s=args.slow_s, hang_s=args.deadline_s + 1.0) for mode, nodes in MODES.items()}
    results = []
    with tempfile.TemporaryDirectory(prefix="gossamer-tlpp-faults-") as tmp:
        ids = {mode: identities(shape) for mode, shape in shapes.items()}
        want: dict[str, Kept | None] = {"base": await reference(shape=shapes["base"], ids=ids["base"], plugins=PLUGINS,
                                                                workdir=Path(tmp) / "reference"), "secure": None}
        for i, (source, mode, faults) in enumerate(cases):
            result = await run_case(faults, shape=shapes[mode], ids=ids[mode], workdir=Path(tmp) / str(i),
                                    plugins=PLUGINS, reference=want[mode])
            result.update(source=source, seed=seed if source == "chaos" else None)
            results.append(result)
            print(line(result), flush=True)
    return results


def line(result: dict) -> str:
    """One case: where it came from, its faults, pass or fail, its wall time and its first problems."""
    faults = " + ".join(f"{kind} {peer}@{step}" for kind, peer, step in result["faults"])
    verdict = "pass" if result["passed"] else "FAIL"
    return f"{result['source']:6s} {result['mode']:6s} {faults:58s} {verdict} {result['wall_s']:5.1f} s " + \
        "; ".join(result["problems"][:3])


def table(results: list[dict]) -> None:
    print("| cases | mode | faults each | passed | stops recovered | bit-identical (of those checked) | "
          "largest recheck gap | longest wait (s) | median case (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for source in ("matrix", "chaos"):
        for mode in MODES:
            mine = [r for r in results if r["source"] == source and r["mode"] == mode]
            if not mine:
                continue
            walls = sorted(r["wall_s"] for r in mine)
            stops = sum(len(r.get("stops", [])) for r in mine)
            checked = [r["identical"] for r in mine if r.get("identical") is not None]
            sizes = [len(r["faults"]) for r in mine]
            print(f"| {source} ({len(mine)}) | {mode} | {min(sizes)}-{max(sizes)} | {sum(r['passed'] for r in mine)} "
                  f"| {stops} | {sum(checked)} of {len(checked)} | "
                  f"{max(r.get('recheck_gap', float('inf')) for r in mine):.1e} | "
                  f"{max(r.get('max_wait_s', float('inf')) for r in mine):.1f} | {walls[len(walls) // 2]:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--chaos", type=int, default=12, help="random cases after the matrix")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--deadline_s", type=float, default=3.0, help="node_timeout_s = helper_timeout_s")
    parser.add_argument("--slow_s", type=float, default=1.0)
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/tlpp_faults.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    seed = random.SystemRandom().randrange(2**32) if args.seed is None else args.seed
    print(f"chaos seed {seed} (replay: --seed {seed})", flush=True)
    loads = {"load_before": load_average_text()}
    results = asyncio.run(main_async(args, seed))
    loads["load_after"] = load_average_text()
    print(f"\nTL++ fault matrix: {args.steps} steps a case; load before {loads['load_before']}, after "
          f"{loads['load_after']} (1, 5, 15 min; {os.cpu_count()} cpus); chaos seed {seed}\n")
    table(results)
    write_result(args.json, {"seed": seed, **loads, "results": results}, args=args, indent=1)
    raise SystemExit(0 if all(r["passed"] for r in results) else 1)


if __name__ == "__main__":
    main()
