#!/usr/bin/env python3
"""Network faults for gossip-DiLoCo learners on LocalNet behind ``gossamer_harness.wan`` links:
slow links, stalls, resets, blackhole, partition, 1-byte slicing on one learner's link (``CASES``);
every case must finish every round, within its deadlines (docs/RELIABILITY.md, "Network faults")::

    .venv/bin/python scripts/chaos/wan_faults.py [--rounds 8] [--cases NAME ...] [--json PATH]"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _diloco import bit_identical
from _diloco import run_config as diloco_run

from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.localnet import LocalNet
from gossamer_harness.report import load_average_text, write_result
from gossamer_harness.wan import LinkProfile

ROOT = Path(__file__).resolve().parents[2]
PEERS = 4
DEADLINE_S = 10.0
SLACK_S = 1.0


@dataclass(frozen=True)
class Case:
    name: str
    base: LinkProfile
    fault: LinkProfile | None = None  # l3's link during rounds [first, last]
    first: int = 1
    last: int = 2


CASES = [
    Case("10mbit_50ms", LinkProfile.from_mbit(10, 50)),
    Case("1mbit_200ms_jitter", LinkProfile.from_mbit(1, 200, jitter_s=0.05)),
    Case("stalls", LinkProfile.from_mbit(10, 50, drop_probability=0.05, retransmit_delay_s=0.2)),
    Case("resets", LinkProfile.from_mbit(10, 50), LinkProfile.from_mbit(10, 50, reset_probability=0.5,
                                                                       reset_window_bytes=64 << 10, seed=3)),
    Case("blackhole", LinkProfile.from_mbit(10, 50), LinkProfile(latency_s=3600.0)),
    Case("partition", LinkProfile.from_mbit(10, 50), LinkProfile(refuse_probability=1.0)),
    Case("sliced", LinkProfile.from_mbit(10, 50), LinkProfile.from_mbit(10, 50, slice_bytes=1)),
]


def run_config(rounds: int) -> dict:
    return diloco_run("wan-faults", peers=PEERS, rounds=rounds, deadline_s=DEADLINE_S)


async def after_round(net: LocalNet, role: LearnerRole, round: int) -> None:
    """Until ``role`` has finished ``round`` (its ledger is kept; the view refreshes at every round)."""
    await net["l0"].ctx.until_view(lambda: role.history.get(round) is not None or role.finished, timeout_s=600)


async def one_case(case: Case, *, rounds: int, workdir: Path) -> dict:
    net = await LocalNet.create(run_config(rounds), plugins=PLUGINS, workdir=workdir)
    roles = {f"l{i}": (await net.add(f"l{i}", ("learner",))).role for i in range(PEERS)}
    for name in roles:
        await net.shape(name, case.base)
    started = time.monotonic()
    try:
        await net.start()
        if case.fault is not None:
            await after_round(net, roles["l0"], case.first - 1)  # type: ignore[arg-type]
            await net.shape("l3", case.fault)
            await after_round(net, roles["l0"], case.last)  # type: ignore[arg-type]
            await net.shape("l3", case.base)
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in roles.values())), timeout=600)
        return {"case": case.name, "wall_s": time.monotonic() - started, **check(roles, rounds)}  # type: ignore[arg-type]
    finally:
        await net.aclose()


def check(roles: dict[str, LearnerRole], rounds: int) -> dict:
    """The pass conditions (module docstring), and ``in_step_from``: the round from which every
    learner's every round is complete (reported, not a pass condition)."""
    problems, max_wait, partial, partial_at = [], 0.0, 0, set()
    for name, role in roles.items():
        if not (role.finished and role.round == rounds):
            problems.append(f"{name} stopped at round {role.round}")
        for ledger in role.history:
            problems += [f"{name} round {ledger.round}: {p}" for p in ledger.balance_problems()]
            max_wait = max(max_wait, ledger.w1_wait_s, ledger.w2_wait_s)
            partial += ledger.partial()
            if ledger.partial():
                partial_at.add(ledger.round)
    if max_wait > DEADLINE_S + SLACK_S:
        problems.append(f"a wait went past its deadline ({max_wait:.1f} s)")
    complete = [role for role in roles.values()
                if (last := role.history.get(rounds - 1)) is not None and not last.partial()]
    identical = bit_identical(complete)
    if not identical:
        problems.append("the learners complete in the final exact-average round are not bit-identical")
    return {"partial_rounds": partial, "in_step_from": max(partial_at, default=-1) + 1,
            "complete_in_last_round": len(complete), "max_wait_s": max_wait,
            "identical": identical, "problems": problems, "passed": not problems}


async def main_async(args: argparse.Namespace) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory(prefix="gossamer-wan-faults-") as tmp:
        for case in (case for case in CASES if case.name in args.cases):
            result = await one_case(case, rounds=args.rounds, workdir=Path(tmp) / case.name)
            results.append(result)
            print(f"{case.name:20s} {'pass' if result['passed'] else 'FAIL'} {result['wall_s']:.1f} s "
                  f"partial rounds {result['partial_rounds']} {'; '.join(result['problems'][:3])}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--cases", nargs="+", choices=[case.name for case in CASES],
                        default=[case.name for case in CASES], help="the cases to run (default: all)")
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/wan_faults.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    load_before = load_average_text()
    results = asyncio.run(main_async(args))
    print(f"\nDiLoCo over WAN links: {PEERS} learners, {args.rounds} rounds, l3's fault in rounds 1-2; "
          f"load before {load_before}, after {load_average_text()}\n")
    print("| case | passed | wall (s) | partial rounds (of all learners') | every round complete from | "
          "longest wait (s) | learners complete in the last round, bit-identical |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['case']} | {'yes' if r['passed'] else 'NO'} | {r['wall_s']:.1f} | {r['partial_rounds']} of "
              f"{PEERS * args.rounds} | {r['in_step_from']} | {r['max_wait_s']:.1f} | {r['complete_in_last_round']}, "
              f"{'yes' if r['identical'] else 'NO'} |")
    write_result(args.json, {"results": results, "load_before": load_before, "load_after": load_average_text()},
                 args=args, indent=1)
    if not all(r["passed"] for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
