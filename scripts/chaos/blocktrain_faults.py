#!/usr/bin/env python3
"""Fault matrix for BlockTrain: every single fault and every pair on workers, the coordinator and
block servers (``gossamer_harness.blocktrain.faultcase``, checked by ``faultchecks``), then seeded
random chaos (the seed is printed and in the JSON: any run replays); docs/RELIABILITY.md::

    .venv/bin/python scripts/chaos/blocktrain_faults.py [--chaos 8] [--seed N] [--json PATH]"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import random
import tempfile
from pathlib import Path

from gossamer.protocols.core.text_data import load_text
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.blocktrain.faultcase import HOSTS, KINDS, PASS_FAULTS, WORKERS, CaseConfig, Fault
from gossamer_harness.blocktrain.faultchecks import describe, run_case
from gossamer_harness.report import load_average_text, write_result

ROOT = Path(__file__).resolve().parents[2]
FIRST = {"worker": "w3", "coordinator": "c", "host": "h0"}
SECOND = {"worker": "w2", "coordinator": "c", "host": "h1"}


def fault(role: str, kind: str, peer: str, version: int, versions: int) -> Fault:
    return (kind, peer, versions if role == "host" and kind in PASS_FAULTS else version)


def matrix(versions: int) -> list[list[Fault]]:
    singles = [[fault(role, kind, FIRST[role], 1, versions)] for role, kinds in KINDS.items() for kind in kinds]
    cross = [[fault(a, ka, FIRST[a], 1, versions), fault(b, kb, FIRST[b], 1, versions)]
             for a, b in itertools.combinations(KINDS, 2) for ka in KINDS[a] for kb in KINDS[b]]
    same = [[fault(role, ka, SECOND[role], 1, versions),
             fault(role, kb, FIRST[role], 2 if role == "coordinator" else 1, versions)]
            for role, kinds in KINDS.items() for ka, kb in itertools.combinations_with_replacement(kinds, 2)]
    return singles + cross + same


def chaos(rng: random.Random, count: int, versions: int) -> list[list[Fault]]:
    """``count`` cases of one or two random faults on distinct random peers, versions 0..versions-2
    (1..versions-2 on the coordinator: version 0 is never opened by a close, nor aggregated twice)."""
    peers = ["c", *(f"w{i}" for i in range(WORKERS)), *(f"h{i}" for i in range(HOSTS))]
    cases = []
    for _ in range(count):
        chosen = rng.sample(peers, k=rng.choice((1, 2)))
        cases.append([fault(role, kind, peer, rng.randrange(int(role == "coordinator"), versions - 1), versions)
                      for peer in chosen for role in [_role(peer)] for kind in [rng.choice(KINDS[role])]])
    return cases


def _role(peer: str) -> str:
    return "coordinator" if peer == "c" else "worker" if peer.startswith("w") else "host"


async def main_async(args: argparse.Namespace, seed: int) -> list[dict]:
    cases = [("matrix", faults) for faults in matrix(args.versions)][:args.limit]
    cases += [("chaos", faults) for faults in chaos(random.Random(seed), args.chaos, args.versions)]
    results = []
    with tempfile.TemporaryDirectory(prefix="gossamer-bt-faults-") as tmp:
        data = Path(tmp) / "text.txt"
        data.write_bytes(load_text("builtin:pydoc")[:200_000])
        config = CaseConfig(data=data, versions=args.versions, deadline_s=args.deadline_s, slow_s=args.slow_s,
                            hang_s=args.hang_s, route_timeout_s=args.route_timeout_s)
        for i, (source, faults) in enumerate(cases):
            result = await run_case(faults, config=config, plugins=PLUGINS, workdir=Path(tmp) / str(i))
            result.update(source=source, seed=seed if source == "chaos" else None)
            results.append(result)
            print(f"{source:6s} {describe(faults):52s} {'pass' if result['passed'] else 'FAIL'} "
                  f"{result['wall_s']:5.1f} s lives {result['lives']} {'; '.join(result['problems'][:3])}", flush=True)
    return results


def table(results: list[dict]) -> list[str]:
    lines = ["| cases | faults each | passed | copies bit-identical | versions rechecked | largest recheck gap "
             "| longest version wait (s) | longest client pass (s) | median case (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for source in ("matrix", "chaos"):
        mine = [r for r in results if r["source"] == source]
        if mine:
            walls = sorted(r["wall_s"] for r in mine)
            lines.append(f"| {source} ({len(mine)}) | {min(len(r['faults']) for r in mine)}-"
                         f"{max(len(r['faults']) for r in mine)} | {sum(r['passed'] for r in mine)} | "
                         f"{sum(r['identical'] for r in mine)} | {sum(r['rechecked'] for r in mine)} | "
                         f"{max(r['recheck_gap'] for r in mine):.1e} | {max(r['max_wait_s'] for r in mine):.1f} | "
                         f"{max(r['max_pass_s'] for r in mine):.1f} | {walls[len(walls) // 2]:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--chaos", type=int, default=8, help="random cases after the matrix")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--limit", type=int, default=None, help="run only the first N matrix cases")
    parser.add_argument("--deadline_s", type=float, default=3.0)
    parser.add_argument("--slow_s", type=float, default=1.0)
    parser.add_argument("--hang_s", type=float, default=4.5)
    parser.add_argument("--route_timeout_s", type=float, default=2.0)
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/blocktrain_faults.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"chaos seed {seed} (replay: --seed {seed})", flush=True)
    load_before = load_average_text()
    results = asyncio.run(main_async(args, seed))
    load_after = load_average_text()
    print(f"\nBlockTrain fault matrix: {WORKERS} workers, {HOSTS} hosts, the coordinator, {args.versions} versions; "
          f"chaos seed {seed}; load before {load_before}, after {load_after}\n")
    print("\n".join(table(results)))
    write_result(args.json, {"seed": seed, "results": results, "load_before": load_before, "load_after": load_after},
                 args=args, indent=1)
    if not all(r["passed"] for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
