"""Running a BlockTrain fault case (``faultcase``) and what it must show: the run finished, every
ledger balances and holds every update a worker was answered for, no version waited past its
deadline, every version on disk is the protocol's result over the updates it used (``recheck``),
faulted workers' updates used only as the protocol allows, copies that must agree bit-identical,
and the client's passes equal to the protocol's pass while a server is usable."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gossamer.peer.plugin import PluginRegistry
from gossamer_harness.blocktrain.faultcase import (
    CRASHES,
    HOSTS,
    NUM_BLOCKS,
    Case,
    CaseConfig,
    Fault,
    role_of,
    run_doc,
)
from gossamer_harness.blocktrain.recheck import agreement_problems, recheck
from gossamer_harness.localnet import LocalNet

TOLERANCE = 1e-5  # max abs gap between a served version and its recomputation (float32)


def describe(faults: list[Fault]) -> str:
    return " + ".join(f"{kind} {peer}@{version}" for kind, peer, version in faults)


async def run_case(faults: list[Fault], *, config: CaseConfig, plugins: PluginRegistry, workdir: Path) -> dict:
    """Build the case, train, run the passes and check; the result (``faultchecks.check``)."""
    net = await LocalNet.create(run_doc(config), plugins=plugins, workdir=workdir, keep_sent=True)
    case = Case(net, faults, config)
    started = time.monotonic()
    try:
        await case.build()
        try:
            await case.train()
            await case.client_passes()
            stuck = None
        except TimeoutError as exc:
            stuck = str(exc)
        result = check(case)
        if stuck is not None:
            result["problems"].insert(0, stuck)
            result["passed"] = False
        return {"faults": faults, "wall_s": time.monotonic() - started, **result}
    finally:
        await case.aclose()
        await net.aclose()


def check(case: Case) -> dict[str, Any]:
    """The problems found, in words (none: the case passed), and the case's measures."""
    problems = _run_problems(case)
    ledgers, measures = _ledger_problems(case)
    problems += ledgers
    problems += _worker_problems(case)
    live = {name: server for name, server in case.servers().items() if case.net[name].alive}
    disagreements = agreement_problems(case.states, live)
    problems += disagreements + _pass_problems(case)
    return {**measures, "lives": len(case.lives), "identical": not disagreements,
            "passes": [outcome[:120] for outcome, _ in case.passes],
            "max_pass_s": max((s for _, s in case.passes), default=0.0),
            "problems": problems, "passed": not problems}


def _run_problems(case: Case) -> list[str]:
    """The last coordinator life has every block at the target, there was one life more than the
    coordinator crashes that fired, and every crash fired (but h1's crash with a pass in hand while
    h0 serves: routes take h0) and left its worker or host dead."""
    problems = []
    coordinator, versions = case.coordinator, case.config.versions
    if not coordinator.finished or coordinator.board.versions != [versions] * coordinator.board.num_blocks:
        problems.append(f"the run did not finish: versions {coordinator.board.versions}")
    fired = [f for f in case.faults if f[0] in CRASHES and case.fired(f)]
    h0_lost = any(peer == "h0" and kind != "slow_send" for kind, peer, _ in case.faults)
    problems += [f"{describe([f])} never fired" for f in case.faults if f[0] in CRASHES and f not in fired
                 and not (f[:2] == ("crash_mid_send", "h1") and not h0_lost)]  # routes take h0 while it serves
    problems += [f"{f[1]} did not die of {f[0]}" for f in fired if role_of(f[1]) != "coordinator"
                 and case.net[f[1]].alive]
    crashes = sum(role_of(f[1]) == "coordinator" for f in fired)
    if len(case.lives) != 1 + crashes:
        problems.append(f"{len(case.lives)} coordinator lives for {crashes} coordinator crash(es)")
    return problems


def _ledger_problems(case: Case) -> tuple[list[str], dict[str, Any]]:
    """Every closed ledger of every life balances; no version waited longer from its opening to its
    close (less ``deadline_s`` per extension) than ``deadline_s`` plus the coordinator's injected
    stalls plus ``slack_s``; every version that reached the disk is within ``TOLERANCE`` of its
    recomputation, and only a life that died closed one that never reached it."""
    config, net = case.config, case.net
    stall = NUM_BLOCKS * sum(config.slow_s if kind == "slow_send" else config.hang_s  # at each block's close
                             for kind, peer, _ in case.faults if peer == "c" and kind in ("slow_send", "hang"))
    names = {net[name].peer_id: name for name in net.peers if not name.startswith("c")}
    problems: list[str] = []
    gaps, lost, max_wait = [], [], 0.0
    for life, ledger in case.states.closed_ledgers():
        where = f"{life} block {ledger.block} version {ledger.version}"
        problems += [f"{where}: {p}" for p in ledger.balance_problems()]
        assert ledger.closed_at is not None
        wait = ledger.closed_at - ledger.opened_at - ledger.deadline_extensions * config.deadline_s
        max_wait = max(max_wait, wait)
        if wait > config.deadline_s + stall + config.slack_s:
            problems.append(f"{where} waited {wait:.1f} s past its opening (deadline {config.deadline_s} s)")
        try:
            gap = recheck(case.states, life, ledger, sent=net.sent.tensors, names=names)  # type: ignore[union-attr]
        except (KeyError, ValueError) as exc:
            problems.append(f"{where} could not be recomputed: {exc}")
            continue
        if gap is None:
            lost.append(where)
            if life == case.lives[-1]:
                problems.append(f"{where} closed but never reached the disk, and its life did not die")
        else:
            gaps.append(gap)
    gap = max(gaps, default=0.0)
    if not gap <= TOLERANCE:
        problems.append(f"a version is {gap:.2e} from the protocol's result over the updates it used")
    return problems, {"recheck_gap": gap, "rechecked": len(gaps), "lost_versions": lost, "max_wait_s": max_wait}


def _submission_problems(case: Case) -> list[str]:
    """Every update a worker had an answer for is in a ledger of the life that answered: accepted
    ones in ``arrived``, refused ones in ``rejected`` or ``refused_again``."""
    problems = []
    ledgers = [ledger for role in case.states.lives.values() for ledger in role.board.ledgers]
    for name, worker in case.workers().items():
        me = worker.peer_id
        accepted = sum(me in ledger.arrived for ledger in ledgers)
        refused = sum((me in ledger.rejected) + sum(p == me for p, _ in ledger.refused_again) for ledger in ledgers)
        if (accepted, refused) != (worker.updates["accepted"], worker.updates["refused"]):
            problems.append(f"{name} had {worker.updates['accepted']} update(s) accepted and {worker.updates['refused']} "
                            f"refused; the ledgers hold {accepted} and {refused}")
    return problems


def _worker_problems(case: Case) -> list[str]:
    """A crashed worker's update of its version is used nowhere; a hung one's only by a version whose
    deadline was extended or when the coordinator itself stalled; a slow one's is used (unless a
    crash moved workers between blocks: then a version may close without it)."""
    problems = _submission_problems(case)
    ledgers = [ledger for _, ledger in case.states.closed_ledgers()]
    stalled = any(peer == "c" and kind in ("slow_send", "hang") for kind, peer, _ in case.faults)
    moved = any(kind in CRASHES and not peer.startswith("h") for kind, peer, _ in case.faults)  # reassigned
    for kind, peer, version in case.faults:
        if not peer.startswith("w"):
            continue
        worker = case.workers()[peer]
        at = [ledger for ledger in ledgers if ledger.version == version]
        if kind in ("crash_before", "crash_mid_send") and any(
                worker.peer_id in ledger.used for ledger in at if ledger.block == worker.block):
            problems.append(f"{peer} crashed at version {version}, yet its update of it was used")
        if kind == "hang" and not stalled and any(worker.peer_id in ledger.used and not ledger.deadline_extensions
                                                  for ledger in at):
            problems.append(f"{peer}'s update of version {version}, held past the deadline, was used")
        if kind == "slow_send" and not moved and not any(worker.peer_id in ledger.used for ledger in at):
            problems.append(f"{peer}'s slow update of version {version} was not used")
    return problems


def _pass_problems(case: Case) -> list[str]:
    """Two client passes, bit-identical to the protocol's while a server neither crashed nor hangs,
    failing naming the route otherwise; none longer than three route budgets (plus ``slack_s``)."""
    lost = {peer for kind, peer, _ in case.faults if peer.startswith("h") and kind != "slow_send"}
    usable = HOSTS - len(lost)
    problems = []
    if len(case.passes) != 2:
        problems.append(f"{len(case.passes)} client passes ran, not 2")
    for outcome, seconds in case.passes:
        if usable and outcome != "equal":
            problems.append(f"a client pass with {usable} usable server(s): {outcome[:200]}")
        if not usable and not outcome.startswith("route failed"):
            problems.append(f"a client pass with no usable server: {outcome}")
        if seconds > 3 * case.config.route_timeout_s + case.config.slack_s:
            problems.append(f"a client pass took {seconds:.1f} s")
    return problems
