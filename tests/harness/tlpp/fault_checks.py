"""What a TL++ fault case must show (``fault_runs``; the fault test and the chaos script): the run
finishes; each stop is one an injected fault explains, with nothing half-applied; every ledger
balances and every applied step is within tolerance of the protocol's result over the nodes it
used (``recheck``); dead nodes are never used again; no step waited past its deadline. The list is
in ``protocols/tlpp/README.md``, "Faults"."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gossamer_harness.tlpp.recheck import Kept, recheck

if TYPE_CHECKING:
    from gossamer_harness.tlpp.fault_runs import Case

BASE_TOLERANCE = 1e-5
SECURE_TOLERANCE = 5e-5  # fixed point: 2^-16 ~ 1.5e-5 per rounding, summed over the nodes
SLACK_S = 3.0  # the event loop's own latency past a deadline, on a loaded host


def check(case: Case, reference: Kept | None) -> dict[str, Any]:
    """The verdict on one case as it ran: its stops, gaps, waits and problems; ``passed`` when none."""
    problems = list(case.problems)
    final = case.lives[-1] if case.lives else None
    if final is None or not final.finished or final.step != case.shape.steps:
        problems.append(f"the run did not finish its {case.shape.steps} steps")
    problems += _stops(case)
    ledgers = [ledger for role in case.lives for ledger in role.history]
    problems += [f"step {ledger.step}: {p}" for ledger in ledgers for p in ledger.balance_problems()]
    applied = [ledger.step for ledger in ledgers if ledger.applied]
    if sorted(set(applied)) != sorted(applied) or {ledger.step for ledger in ledgers} != set(range(case.shape.steps)):
        problems.append(f"the lives' ledgers do not account for each step once: {sorted(x.step for x in ledgers)}, "
                        f"applied {sorted(applied)}")
    gap = _gaps(case, problems)
    problems += _nodes(case)
    waited = _waits(case, problems)
    identical = None
    if reference is not None and final is not None and _lost_no_node(case):
        identical = Kept.of(final).same(reference)
        if not identical:
            problems.append("the run lost no node but did not end bit-identical to the run without faults")
    return {"stops": case.stops, "recheck_gap": gap, "max_wait_s": waited, "identical": identical,
            "applied": sum(ledger.applied for ledger in case.states.ledgers.values()), "problems": problems,
            "passed": not problems}


def _stops(case: Case) -> list[str]:
    """Each stop was one an injected fault explains."""
    problems = []
    targets = {peer for _, peer, _ in case.faults}
    for stop in case.stops:
        if stop["how"] == "killed" and "orchestrator" not in targets:
            problems.append(f"life {stop['life']} was killed, but no fault was injected into the orchestrator")
        elif stop["how"] not in ("killed", "HelperFailed") or (stop["how"] == "HelperFailed" and "helper" not in targets):
            problems.append(f"life {stop['life']} stopped at step {stop['step']}: {stop['how']}: {stop['error']}")
    return problems


def _gaps(case: Case, problems: list[str]) -> float:
    tolerance = SECURE_TOLERANCE if case.shape.mode == "secure" else BASE_TOLERANCE
    data = {peer.peer_id: peer.role.data for name, peer in case.net.peers.items()  # type: ignore[attr-defined]
            if name.startswith("node")}
    settings = case.lives[0].settings if case.lives else None
    gap = 0.0
    for step in sorted(case.states.ledgers):
        try:
            one = recheck(step, states=case.states, settings=settings, data=data)  # type: ignore[arg-type]
        except KeyError as exc:
            one = float("inf")
            problems.append(f"step {step} could not be recomputed: {exc}")
        if not one <= tolerance:
            problems.append(f"step {step} is {one:.2e} from the protocol's result over the nodes it used")
        gap = max(gap, one)
    return gap


def _nodes(case: Case) -> list[str]:
    problems = []
    ids = {name: case.net[name].peer_id for name in case.net.peers if name.startswith("node")}
    ledgers = [ledger for role in case.lives for ledger in role.history]
    for kind, peer, step in case.faults:
        if not peer.startswith("node"):
            continue
        node = ids[peer]
        dead = peer in case.dead
        if kind in ("crash_before", "crash_mid_send", "hang"):  # a crash that fired killed it
            for ledger in ledgers:
                if node in ledger.used and (ledger.step == step or (dead and ledger.step > step)):
                    problems.append(f"{peer} ({kind} at step {step}) was used in step {ledger.step}")
                if dead and ledger.step > step and node in ledger.planned:
                    problems.append(f"{peer} died at step {step} and was planned in step {ledger.step}")
        if kind == "slow":
            last = case.states.ledgers.get(step)
            if last is not None and last.applied and node in last.planned and node not in last.used:
                problems.append(f"{peer} was slow in step {step} (inside its deadline) and not used: {last.rejected}")
    failed = [step for kind, peer, step in case.faults if peer.startswith("node") and kind != "slow"]
    hung = {ids[peer] for kind, peer, _ in case.faults if kind == "hang" and peer.startswith("node")}
    for step, ledger in case.states.ledgers.items():  # a hung node scheduled again may still be stalled
        if failed and step > max(failed) and ledger.applied and not set(ledger.planned) - set(ledger.used) <= hung:
            problems.append(f"step {step} (after the last node fault) used {len(ledger.used)} of the "
                            f"{len(ledger.planned)} nodes it planned: {ledger.rejected}")
    return problems


def _waits(case: Case, problems: list[str]) -> float:
    """The longest step, less the orchestrator's own stall in it; a problem for one past its deadline."""
    longest = 0.0
    for ledger in (ledger for role in case.lives for ledger in role.history):
        hung = sum(1 for kind, peer, step in case.faults if kind == "hang" and step == ledger.step
                   and peer != "orchestrator")
        own = sum(case.shape.slow_s if kind == "slow" else case.shape.hang_s for kind, peer, step in case.faults
                  if kind in ("slow", "hang") and peer == "orchestrator" and step == ledger.step)
        waited = max(0.0, ledger.wall_s - own)
        longest = max(longest, waited)
        deadline_s = max(1, hung) * case.shape.deadline_s + SLACK_S
        if waited > deadline_s:
            problems.append(f"step {ledger.step} waited {waited:.1f} s, past its deadline of {deadline_s:.1f} s")
    return longest


def _lost_no_node(case: Case) -> bool:
    return all(kind == "slow" or not peer.startswith("node") for kind, peer, _ in case.faults) and not any(
        stop["how"] == "HelperFailed" for stop in case.stops)
