#!/usr/bin/env python3
"""Fault matrix for gossip-DiLoCo learners on LocalNet: every single fault and pair, then seeded
chaos, every survivor's rounds rechecked (docs/RELIABILITY.md, "Faults survived: DiLoCo")::

    .venv/bin/python scripts/chaos/fault_matrix.py [--rounds 4] [--chaos 8] [--seed N] [--aggregator NAME] [--w1_clip_tau X]"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _diloco import bit_identical
from _diloco import run_config as diloco_run

from gossamer.protocols.core.robust import AGGREGATORS, DEFAULT
from gossamer.protocols.diloco.learner import LearnerRole
from gossamer.protocols.registry import PLUGINS
from gossamer_harness.diloco.recheck import RoundStates, recheck
from gossamer_harness.localnet import LocalNet
from gossamer_harness.report import load_average_text, write_result

ROOT = Path(__file__).resolve().parents[2]
PEERS = 5
DEADLINE_S = 10.0
SLACK_S = 1.0  # the event loop's own latency past a deadline
TOLERANCE = 1e-5  # max abs gap between a survivor's applied round and the recomputed one (float32)
Fault = tuple[str, str, int]  # (kind, peer, round)
CRASHES = ("crash_before", "crash_mid_send", "crash_mid_aggregate")
KINDS = (*CRASHES, "slow_send")
SELECTING = ("krum", "multi_krum")  # W2 rules that use only the pseudo-gradients they select


@dataclass(frozen=True)
class Setup:
    """How every case's learners mix: the W2 aggregator (name and parameters) and the W1 clipping radius."""

    aggregator: str = DEFAULT
    params: dict[str, Any] = field(default_factory=dict)
    w1_clip_tau: float = 0.0

    def run_config(self, rounds: int) -> dict:
        return diloco_run("fault-matrix", peers=PEERS, rounds=rounds, deadline_s=DEADLINE_S,
                          aggregator={"name": self.aggregator, **self.params}, w1_clip_tau=self.w1_clip_tau)


def inject(net: LocalNet, fault: Fault, slow_s: float) -> None:
    kind, peer, round = fault
    actions: dict[str, Callable[[], None]] = {
        "crash_before": lambda: net.crash(peer, round, "params", expire=True),
        "crash_mid_send": lambda: net.crash(peer, round, "pgrad", after=1, expire=True),
        "slow_send": lambda: net.slow(peer, slow_s, op="pgrad", step=round),
        "crash_mid_aggregate": lambda: net.crash(peer, round, "aggregate", expire=True),
    }
    actions[kind]()


async def one_case(faults: list[Fault], *, rounds: int, slow_s: float, workdir: Path, setup: Setup) -> dict:
    net = await LocalNet.create(setup.run_config(rounds), plugins=PLUGINS, workdir=workdir, keep_sent=True)
    roles: dict[str, LearnerRole] = {f"l{i}": (await net.add(f"l{i}", ("learner",))).role  # type: ignore[misc]
                                     for i in range(PEERS)}
    states = RoundStates(roles)
    net.watchers.append(states)
    for fault in faults:
        inject(net, fault, slow_s)
    crashed = {peer for kind, peer, _ in faults if kind in CRASHES}
    survivors = {name: role for name, role in roles.items() if name not in crashed}
    started = time.monotonic()
    try:
        await net.start()
        await asyncio.wait_for(asyncio.gather(*(role.drain() for role in survivors.values())), timeout=600)
        wall = time.monotonic() - started
        return {"faults": faults, "wall_s": wall, **check(net, survivors, crashed, faults, rounds, states, setup)}
    finally:
        await net.aclose()


def check(net: LocalNet, survivors: dict[str, LearnerRole], crashed: set[str], faults: list[Fault],
          rounds: int, states: RoundStates, setup: Setup) -> dict:
    settled_from = max([r + 1 for kind, _, r in faults if kind in CRASHES], default=0)
    problems: list[str] = []
    max_wait = 0.0
    for name, role in survivors.items():
        if not (role.finished and role.round == rounds):
            problems.append(f"{name} stopped at round {role.round}")
        others = sorted(r.peer_id for n, r in survivors.items() if n != name)
        for t in range(rounds):
            ledger = role.history.get(t)
            if ledger is None:
                problems.append(f"{name} has no ledger for round {t}")
                continue
            problems += [f"{name} round {t}: {p}" for p in ledger.balance_problems()]
            max_wait = max(max_wait, ledger.w1_wait_s, ledger.w2_wait_s)
            pgrads = ledger.pseudo_gradients
            used_all = setup.aggregator in SELECTING or pgrads.used == others
            if t >= settled_from and (ledger.params.used != others or pgrads.arrived != others or not used_all):
                problems.append(f"{name} round {t} used {len(ledger.params.used)} parameter sets and received "
                                f"{len(pgrads.arrived)} pseudo-gradients (used {len(pgrads.used)}), not the "
                                f"{len(others)} survivors'")
    dead = [peer for peer in crashed if net[peer].alive]
    problems += [f"{peer} did not crash" for peer in dead]
    for kind, peer, r in faults:
        replica = net[peer].role.replica  # type: ignore[attr-defined]
        if kind == "crash_mid_aggregate" and (replica.round, replica.phase) != (r, "outer"):
            problems.append(f"{peer} died at round {replica.round} in phase {replica.phase}, not mid-aggregate of {r}")
    names = {net[name].peer_id: name for name in net.peers}
    try:
        gap = max(recheck(name, t, states=states, sent=net.sent.tensors, names=names)  # type: ignore[union-attr]
                  for name in survivors for t in range(rounds))
    except (KeyError, ValueError) as exc:
        gap = float("inf")
        problems.append(f"a survivor's round could not be recomputed: {exc}")
    if not gap <= TOLERANCE:
        problems.append(f"a survivor's applied round is {gap:.2e} from the protocol's result over what it used")
    if max_wait > DEADLINE_S + SLACK_S:
        problems.append(f"a wait went past its deadline ({max_wait:.1f} s)")
    identical = bit_identical(list(survivors.values()))
    if not identical and not setup.w1_clip_tau:
        problems.append("the survivors are not bit-identical after the exact-average round")
    return {"survivors": sorted(survivors), "max_wait_s": max_wait, "identical": identical, "recheck_gap": gap,
            "problems": problems, "passed": not problems}


def matrix(rounds: int) -> list[list[Fault]]:
    """Every single fault on l4 in round 1, every pair on l3 and l4 in rounds 1 and 1 or 1 and 2."""
    singles = [[(kind, "l4", 1)] for kind in KINDS]
    pairs = [[(a, "l3", 1), (b, "l4", rb)] for a, b in itertools.product(KINDS, KINDS) for rb in (1, 2)
             if rb < rounds - 1]
    return singles + pairs


def chaos(rng: random.Random, count: int, rounds: int) -> list[list[Fault]]:
    """``count`` cases of one or two random faults on random peers (at most two crash), rounds 0..rounds-2."""
    cases = []
    for _ in range(count):
        peers = rng.sample([f"l{i}" for i in range(PEERS)], k=rng.choice((1, 2)))
        cases.append([(rng.choice(KINDS), peer, rng.randrange(rounds - 1)) for peer in peers])
    return cases


async def main_async(args: argparse.Namespace, setup: Setup) -> list[dict]:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"chaos seed {seed} (replay: --seed {seed})", flush=True)
    cases = [("matrix", faults) for faults in matrix(args.rounds)]
    cases += [("chaos", faults) for faults in chaos(random.Random(seed), args.chaos, args.rounds)]
    results = []
    with tempfile.TemporaryDirectory(prefix="gossamer-faults-") as tmp:
        for i, (source, faults) in enumerate(cases):
            result = await one_case(faults, rounds=args.rounds, slow_s=args.slow_s, workdir=Path(tmp) / str(i),
                                    setup=setup)
            result.update(source=source, seed=seed if source == "chaos" else None)
            results.append(result)
            print(f"{source:6s} {describe(faults):60s} {'pass' if result['passed'] else 'FAIL'} "
                  f"{result['wall_s']:.1f} s {'; '.join(result['problems'][:3])}", flush=True)
    return results


def describe(faults: list[Fault]) -> str:
    return " + ".join(f"{kind} {peer}@{round}" for kind, peer, round in faults)


def aggregator_param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``, the value read as JSON (a number, true/false) or else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--chaos", type=int, default=8, help="random cases after the matrix")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--slow_s", type=float, default=2.0)
    parser.add_argument("--json", type=Path, default=ROOT / "scripts/chaos/results/fault_matrix.json")
    parser.add_argument("--aggregator", choices=sorted(AGGREGATORS), default=DEFAULT, help="the W2 aggregator")
    parser.add_argument("--aggregator_param", action="append", default=[], type=aggregator_param,
                        metavar="KEY=VALUE", help="one of the aggregator's parameters (e.g. f=1); repeat for more")
    parser.add_argument("--w1_clip_tau", type=float, default=0.0, help="> 0: W1 is clipped gossip with this radius")
    args = parser.parse_args()
    setup = Setup(aggregator=args.aggregator, params=dict(args.aggregator_param), w1_clip_tau=args.w1_clip_tau)
    logging.basicConfig(level=logging.ERROR)
    load_before = load_average_text()
    results = asyncio.run(main_async(args, setup))
    passed = sum(r["passed"] for r in results)
    print(f"\nDiLoCo fault matrix: {PEERS} learners, {args.rounds} rounds, W2 {setup.aggregator} {setup.params or ''}, "
          f"W1 clip tau {setup.w1_clip_tau}; load before {load_before}, after {load_average_text()}\n")
    print("| cases | faults each | passed | survivors bit-identical | largest recheck gap | longest wait (s) "
          "| median case (s) |")
    print("|---|---|---|---|---|---|---|")
    for source in ("matrix", "chaos"):
        mine = [r for r in results if r["source"] == source]
        if mine:
            walls = sorted(r["wall_s"] for r in mine)
            print(f"| {source} ({len(mine)}) | {min(len(r['faults']) for r in mine)}-{max(len(r['faults']) for r in mine)} "
                  f"| {sum(r['passed'] for r in mine)} | {sum(r['identical'] for r in mine)} | "
                  f"{max(r['recheck_gap'] for r in mine):.1e} | "
                  f"{max(r['max_wait_s'] for r in mine):.1f} | {walls[len(walls) // 2]:.1f} |")
    write_result(args.json, {"results": results, "load_before": load_before, "load_after": load_average_text()},
                 args=args, indent=1)
    if passed < len(results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
