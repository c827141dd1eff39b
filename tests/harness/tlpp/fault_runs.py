"""TL++ runs on a ``LocalNet`` with faults injected by (kind, peer, step) at the phase each role
marks (``RoleContext.fault_point``), recovered as an operator would (the orchestrator, and after a
helper failure the helper, restarted with the same identity and checkpoint folder) and checked
(``fault_checks``); for the fault test and ``scripts/chaos/tlpp_faults.py``. The table of faults
and phases is in ``protocols/tlpp/README.md``, "Faults"."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gossamer.crypto.identity import Identity
from gossamer.peer.kit.conditions import wait_until
from gossamer.peer.plugin import PluginRegistry
from gossamer.protocols.tlpp import names
from gossamer.protocols.tlpp.orchestrator import TlppOrchestratorRole
from gossamer_harness.localnet import LocalNet
from gossamer_harness.tlpp.fault_checks import check
from gossamer_harness.tlpp.recheck import Kept, StepStates

Fault = tuple[str, str, int]  # (kind, peer, step)
CRASHES = ("crash_before", "crash_mid_send", "crash_mid_aggregate")
KINDS = (*CRASHES, "slow", "hang")
PHASES = {
    "node": {"crash_before": "forward", "crash_mid_send": "backward", "slow": "forward", "hang": "forward"},
    "orchestrator": {"crash_before": "step", "crash_mid_send": "backward", "crash_mid_aggregate": "aggregate",
                     "slow": "backward", "hang": "backward"},
    "helper": {"crash_before": "logits", "crash_mid_send": "sum", "crash_mid_aggregate": "aggregate",
               "slow": "logits", "hang": "logits"},
}
LIVES = 6  # the most orchestrator lives a case may take (each fault stops at most one)


@dataclass(frozen=True, kw_only=True)
class RunShape:
    """One case's run (the fields say what each is)."""

    mode: str = "base"  # "base" (SGD) or "secure" (Adam, the helper, k = 2)
    nodes: int = 3  # data nodes, node0.., each a digits shard
    steps: int = 4
    deadline_s: float = 4.0  # of a request to a node or the helper (node_timeout_s = helper_timeout_s)
    slow_s: float = 1.0  # a slow peer's stall: inside the deadline
    hang_s: float = 5.0  # a hung peer's stall: past it

    def __post_init__(self) -> None:
        if not self.slow_s < self.deadline_s < self.hang_s:
            raise ValueError(f"need slow_s < deadline_s < hang_s, got {self.slow_s}, {self.deadline_s}, {self.hang_s}")

    def hyper(self) -> dict[str, Any]:
        common = {"steps": self.steps, "eval_every": 0, "min_nodes": self.nodes, "node_timeout_s": self.deadline_s,
                  "helper_timeout_s": self.deadline_s, "helper_wait_s": min(2.0, self.deadline_s / 2)}
        if self.mode == "secure":  # SGD is refused in secure mode; k = 2 nodes and 20 samples must survive
            return {**common, "mode": "secure", "optimizer": "adam", "lr": 0.01, "batch_size": 48}
        return {**common, "mode": "base", "optimizer": "sgd", "lr": 0.2, "batch_size": 24}

    def peers(self) -> list[str]:
        return [f"node{i}" for i in range(self.nodes)] + (["helper"] if self.mode == "secure" else [])

    def role_of(self, peer: str) -> str:
        return "node" if peer.startswith("node") else peer


@dataclass
class Case:
    """One case as it ran: the net, the watcher, the orchestrator's lives and how each ended."""

    shape: RunShape
    faults: list[Fault]
    net: LocalNet
    states: StepStates
    lives: list[TlppOrchestratorRole] = field(default_factory=list)
    stops: list[dict[str, Any]] = field(default_factory=list)  # one per life that did not finish
    errors: list[dict[str, Any]] = field(default_factory=list)  # tlpp.error events
    problems: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    timed_out: bool = False
    dead: set[str] = field(default_factory=set)  # the peers dead when the run ended (before the net closed)


def identities(shape: RunShape) -> dict[str, Identity]:
    """Fresh identities for a run's peers; the same ones give two runs the same schedule."""
    return {name: Identity.generate() for name in [*shape.peers(), "orchestrator"]}


async def build(shape: RunShape, ids: dict[str, Identity], workdir: Path, plugins: PluginRegistry) -> LocalNet:
    """The run's net: nodes on digits shards, the helper (secure; pinned, an allowlist), the orchestrator."""
    doc: dict[str, Any] = {"run": {"name": "faults", "protocol": "tlpp", "heartbeat_s": 30.0}, "hyper": shape.hyper()}
    pin: dict[str, Any] = {}
    if shape.mode == "secure":
        pin = {names.NODE: {"helper": ids["helper"].peer_id}}
        doc["hyper"]["helper"] = ids["helper"].peer_id
        doc["admission"] = {"policy": "allowlist", "allow": [ids[n].public_key.hex() for n in shape.peers()]}
    net = await LocalNet.create(doc, plugins=plugins, workdir=workdir, owner=ids["orchestrator"])
    for i in range(shape.nodes):
        await net.add(f"node{i}", (names.NODE,), identity=ids[f"node{i}"], data=f"builtin:digits:shard={i}/{shape.nodes}",
                      role_options=pin)
    if shape.mode == "secure":
        await net.add("helper", (names.HELPER,), identity=ids["helper"])
    await _add_orchestrator(net, "orchestrator", ids["orchestrator"])
    return net


async def _add_orchestrator(net: LocalNet, name: str, identity: Identity) -> TlppOrchestratorRole:
    peer = await net.add(name, ("orchestrator", names.ORCHESTRATOR), identity=identity, checkpoint_every=1,
                         checkpoint_dir=net.workdir / "checkpoints" / "orchestrator")
    return peer.role_named(names.ORCHESTRATOR)  # type: ignore[return-value]


def orchestrator_of(net: LocalNet, name: str) -> TlppOrchestratorRole | None:
    peer = net.peers.get(name)
    return next((r for r in peer.roles if isinstance(r, TlppOrchestratorRole)), None) if peer is not None else None


def inject(net: LocalNet, shape: RunShape, fault: Fault) -> None:
    kind, peer, step = fault
    phase = PHASES[shape.role_of(peer)][kind]
    if kind in CRASHES:
        net.crash(peer, step, phase, expire=True)
    else:
        net.slow(peer, shape.slow_s if kind == "slow" else shape.hang_s, op=phase, step=step)


async def run_case(faults: list[Fault], *, shape: RunShape, ids: dict[str, Identity], workdir: Path,
                   plugins: PluginRegistry, reference: Kept | None = None, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run one case to its end (recovering from each stop as an operator would) and check it
    (``fault_checks.check``); ``reference``: the final state of a run without faults (base mode:
    a case that lost no node must end bit-identical to it)."""
    case = await play(faults, shape=shape, ids=ids, workdir=workdir, plugins=plugins, timeout_s=timeout_s)
    result = {"faults": faults, "mode": shape.mode, "wall_s": case.wall_s}
    if case.timed_out:
        return {**result, "passed": False, "problems": [f"the case did not end within {timeout_s:.0f} s"],
                "stops": case.stops}
    return {**result, **check(case, reference)}


async def reference(*, shape: RunShape, ids: dict[str, Identity], workdir: Path, plugins: PluginRegistry) -> Kept:
    """The final state of the run without faults."""
    case = await play([], shape=shape, ids=ids, workdir=workdir, plugins=plugins, timeout_s=300.0)
    assert not case.timed_out and case.lives and case.lives[-1].finished, case.problems
    return Kept.of(case.lives[-1])


async def play(faults: list[Fault], *, shape: RunShape, ids: dict[str, Identity], workdir: Path,
               plugins: PluginRegistry, timeout_s: float) -> Case:
    """The case run to its end (or ``timeout_s``), its net closed; ``plugins``: the build's registry."""
    net = await build(shape, ids, workdir, plugins)
    first = orchestrator_of(net, "orchestrator")
    assert first is not None
    case = Case(shape=shape, faults=faults, net=net, states=StepStates(lambda name: orchestrator_of(net, name), first))
    net.watchers.append(case.states)
    net.watchers.append(lambda peer, event, fields: case.errors.append(dict(fields)) if event == "tlpp.error" else None)
    for fault in faults:
        inject(net, shape, fault)
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            await _lives(case, ids)
    except TimeoutError:
        case.timed_out = True
    finally:
        case.wall_s = time.monotonic() - started
        case.dead = {name for name, peer in net.peers.items() if not peer.alive}
        await net.aclose()
    return case


async def _lives(case: Case, ids: dict[str, Identity]) -> None:
    """The orchestrator's lives: each runs until it finishes or stops; a stopped one is checked
    (nothing half-applied) and restarted, with the helper after a helper failure."""
    net, name = case.net, "orchestrator"
    await net.start(*case.shape.peers())
    for life in range(LIVES):
        role = orchestrator_of(net, name)
        assert role is not None
        if life:
            resumed = Kept.of(role)
            last = case.states.after.get(role.step - 1)
            if last is None or not resumed.same(last):
                case.problems.append(f"life {life} resumed at step {role.step} from a state other than that step's")
        await role.start()  # its tlpp-orchestrator role only: the run's manifest is the net's already
        await role.done.wait()
        case.lives.append(role)
        if role.finished:
            return
        case.stops.append(_stopped(case, role, name, life))
        await _gone(net, name)
        if role.error and case.shape.mode == "secure":  # the operator restarts the helper that failed
            await _restart_helper(net, ids["helper"], life)
        name = f"orchestrator~{life + 1}"
        await _add_orchestrator(net, name, ids["orchestrator"])
    case.problems.append(f"the run did not finish in {LIVES} lives of the orchestrator")


def _stopped(case: Case, role: TlppOrchestratorRole, name: str, life: int) -> dict[str, Any]:
    """How a life ended that did not finish: killed, or with which error; and whether its model is
    exactly as after its last step (nothing of the step it was in applied)."""
    last = case.states.after.get(role.step - 1)
    intact = last is not None and Kept.of(role).same(last)
    if not intact:
        case.problems.append(f"life {life} stopped at step {role.step} with something of that step applied")
    kind = case.errors[-1]["kind"] if role.error and case.errors else ("killed" if not case.net[name].alive else "?")
    return {"life": life, "step": role.step, "how": kind, "error": role.error[:200], "intact": intact}


async def _gone(net: LocalNet, name: str) -> None:
    """The peer's process is gone and its record out of the view: a live one (a hung helper, an
    orchestrator stopped with an error) is stopped as the daemon's clean shutdown would (its state
    written); a crashed one is waited for until its crash is done (its record dropped), so that
    nothing of it lands after its successor, who has the same peer id, joined."""
    peer = net[name]
    if peer.alive:
        await net.stop(name)
        net.forget(name)
    await wait_until(net.view_refreshed, lambda: net.view.get(peer.peer_id) is None, timeout_s=60.0)


async def _restart_helper(net: LocalNet, identity: Identity, life: int) -> None:
    old = next(n for n in reversed(list(net.peers)) if n.split("~")[0] == "helper")
    await _gone(net, old)
    fresh = f"helper~{life + 1}"
    await net.add(fresh, (names.HELPER,), identity=identity)
    await net.start(fresh)
