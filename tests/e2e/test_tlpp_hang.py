"""TL++ with a real process hung: ``gossamer orchestrator``, ``gossamer helper`` and data nodes
as separate processes, one of them stopped with SIGSTOP (its whole process group) for a window
that outlasts its deadline, then continued with SIGCONT.

- A hung data node is dropped from the step it misses at ``node_timeout_s`` (fixed pacing): the
  other nodes' steps go on, no step waits past its deadlines, every ledger balances; once
  continued its record is renewed and it is scheduled again (``scheduling``: from the next step).
- A hung orchestrator (secure mode) is waited on: the nodes and the helper serve requests only,
  so they neither fail nor serve anything; continued, it goes on from the step it stopped in
  (steps consecutive, none applied twice, ``applied_steps`` the count of applied steps), and a
  request it slept through is not taken for its peer's timeout (``pacing.within``).
- A hung helper misses ``helper_timeout_s``: secure training stops with one typed error
  (``tlpp.error`` of kind ``HelperFailed``, a checkpoint, exit code 1), the stopped step applied
  nothing and its ledger balances (docs/RELIABILITY.md, "Faults survived: TL++")."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from safetensors.torch import load_file

from gossamer.peer.kit.state_tree import unpack_state
from gossamer_harness.localproc import LOOPBACK, GossamerProcess, Processes
from gossamer_harness.tlpp.runs import BASE_NODE_COMMAND, secure_tables

# Every wait follows the processes' progress; the limit is the last resort (each test takes about a
# minute at load 2, and many times that on a machine as loaded as a busy CI host)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

NODE_TIMEOUT_S = 3.0
HELPER_TIMEOUT_S = 3.0
HEARTBEAT_S = 2.0  # records live 3 heartbeats: a peer stopped just after renewing one is seen gone after 4-6 s, past both deadlines
RUN = """
[run]
name = "hang-{mode}"
protocol = "tlpp"
heartbeat_s = {heartbeat_s}
[model]
cut = 3
[hyper]
mode = "{mode}"
batch_size = 32
optimizer = "adam"
lr = 0.01
steps = {steps}
eval_every = 0
min_nodes = 3
node_timeout_s = {node_timeout_s}
helper_timeout_s = {helper_timeout_s}
helper_wait_s = 2.0
"""
OWN_WORK_S = 5.0
"""What a step may take besides waiting out its deadlines, at least: the orchestrator's own work
(a step without a hung peer takes tens of milliseconds at load 2); on a loaded machine, three
times the slowest step of the run that waited for nobody, if longer."""


class Run:
    """An orchestrator, in secure mode a helper, and three data nodes, as processes (in
    ``processes``: they end with the test)."""

    def __init__(self, processes: Processes, work: Path, *, mode: str, steps: int) -> None:
        tables, node_command = secure_tables(work, [f"node{i}" for i in range(3)]) if mode == "secure" else \
            ("", BASE_NODE_COMMAND)
        (work / "run.toml").write_text(RUN.format(mode=mode, steps=steps, node_timeout_s=NODE_TIMEOUT_S,
                                                  helper_timeout_s=HELPER_TIMEOUT_S, heartbeat_s=HEARTBEAT_S) + tables)
        self.work, self.processes = work, processes
        self.procs: list[GossamerProcess] = []
        self.orch = self._start("orch", ["orchestrator", "-c", str(work / "run.toml"), "--new_swarm"])
        ready = self.orch.wait_ready()
        self.http = ready["http"]
        join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
        self.helper = self._start("helper", ["helper", *join]) if mode == "secure" else None
        self.nodes = [self._start(f"node{i}", [*node_command, *join, "--data", f"builtin:digits:shard={i}/3"])
                      for i in range(3)]
        for proc in self.procs[1:]:
            proc.wait_ready()
        self.ids = [node.latest["ready"]["peer_id"] for node in self.nodes]

    def _start(self, name: str, args: list[str]) -> GossamerProcess:
        proc = self.processes.start([*args, "--events", *LOOPBACK, "--threads", "1", "--identity_path",
                                     str(self.work / f"{name}.pem"), "--checkpoint_dir", str(self.work / "ckpt")],
                                    log_path=self.work / f"{name}.log")
        self.procs.append(proc)
        return proc

    def steps(self, until: Callable[[dict], bool], kinds: tuple[str, ...] = ("tlpp.step",)) -> list[dict]:
        """The orchestrator's events of ``kinds`` up to the first that satisfies ``until``."""
        events: list[dict] = []
        while not events or not until(events[-1]):  # the others' events are read meanwhile (no full pipe)
            events.append(self.orch.wait_event(lambda e: e["event"] in kinds, also=self.procs))
        return events

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://{self.http}/status", timeout=60) as response:
            return json.loads(response.read())


@pytest.fixture
def runs(processes: Processes, tmp_path: Path) -> Callable[..., Run]:
    """``runs(mode=..., steps=...)`` starts a run whose processes end with the test (a stopped one
    is continued first: it could not take SIGTERM)."""
    return lambda **kwargs: Run(processes, tmp_path, **kwargs)


@contextmanager
def stopped(proc: GossamerProcess) -> Iterator[None]:
    """``proc`` and its children (its process group) hung with SIGSTOP; SIGCONT at the end."""
    os.killpg(proc.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(proc.proc.pid, signal.SIGCONT)


def check_ledgers(steps: list[dict]) -> None:
    """Every step once and in order, every ledger balances, and no step waited past its deadlines:
    one forward and one backward phase, each cut at its deadline, plus the orchestrator's own work
    (``OWN_WORK_S``, or three times the slowest step that waited for nobody: as slow as the machine)."""
    numbers = [e["step"] for e in steps]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
    unhindered = [e["wall_s"] for e in steps if e["applied"] and not e["rejected"]]
    own_work_s = max(OWN_WORK_S, 3 * max(unhindered, default=0.0))
    for e in steps:
        assert e["balance_problems"] == [], e
        assert e["wall_s"] <= sum(e["deadline_s"].values()) + own_work_s, (own_work_s, e)


def hang_a_node(run: Run) -> tuple[list[dict], dict, list[dict]]:
    """Stop node2 until the orchestrator has left it out of a step and run 5 more without it; then
    continue it and wait until a step uses it again. Returns every step event from the first,
    the step it was dropped from, and the steps from the one that used it again on (6 of them)."""
    hung, others = run.ids[2], set(run.ids[:2])
    before = run.steps(lambda e: e["step"] >= 3 and hung in e["used"])
    with stopped(run.nodes[2]):
        during = run.steps(lambda e: hung in e["rejected"])
        dropped = during[-1]
        during += run.steps(lambda e: e["step"] >= dropped["step"] + 5)
    back = run.steps(lambda e: hung in e["used"])
    back += run.steps(lambda e: e["step"] >= back[-1]["step"] + 5)

    why = dropped["rejected"][hung]  # it missed its deadline (or, secure, its share never reached the helper)
    assert why.split(":")[0] in ("forward", "backward", "logits", "sum"), dropped
    assert f"no response within {NODE_TIMEOUT_S} s" in why or "the helper holds no" in why, dropped
    assert dropped["deadline_s"] == {"forward": NODE_TIMEOUT_S, "backward": NODE_TIMEOUT_S}, dropped
    # the steps after the drop go on without it (those before may be steps it answered before it stopped)
    assert all(e["applied"] and set(e["used"]) == others for e in during[-5:]), during[-5:]
    assert all(set(e["used"]) == {hung, *others} for e in back[-6:]), back[-6:]  # back for good
    every = before + during + back
    check_ledgers(every)
    return every, dropped, back[-6:]


def test_a_hung_data_node_is_left_out_at_its_deadline_and_scheduled_again_once_continued(runs) -> None:
    run = runs(mode="base", steps=100_000)  # no end in sight: the processes are stopped at the end
    steps, _dropped, _back = hang_a_node(run)
    steps += run.steps(lambda e: e["step"] >= 80)
    check_ledgers(steps)
    first, last = (sum(e["loss"] for e in some) / 5 for some in (steps[:5], steps[-5:]))
    assert last < first - 0.3, "the loss keeps falling" + str((first, last))


def test_a_hung_orchestrator_is_waited_on_and_goes_on_from_the_step_it_stopped_in(runs) -> None:
    run = runs(mode="secure", steps=60)  # secure: a request to the helper it slept through must not stop it
    orchestrator = run.orch.latest["ready"]["peer_id"]
    before = run.steps(lambda e: e["step"] >= 5)
    with stopped(run.orch):
        for node in run.nodes:  # the orchestrator's record expires: each node sees it gone, and waits
            node.wait_event(lambda e: e["event"] == "peers" and orchestrator not in e["peer_ids"], also=run.procs)
        served = [node_status(node) for node in run.nodes]
        for node in run.nodes:
            node.pump()
        assert [node_status(node) for node in run.nodes] == served, "a node serves requests only"
        assert all(proc.proc.poll() is None for proc in run.procs[1:]), "the nodes and the helper wait"
    after = run.steps(lambda e: e["step"] == 59)
    finished = run.orch.wait_event(lambda e: e["event"] == "tlpp.finished", also=run.procs)

    check_ledgers(before + after)  # steps 0..59, each once, in order: it went on where it stopped
    assert (before + after)[0]["step"] == 0
    assert finished["step"] == 60 and finished["applied_steps"] == sum(e["applied"] for e in before + after)
    assert all(set(e["used"]) == set(run.ids) for e in after[-5:]), after[-5:]


def test_secure_a_hung_node_is_left_out_and_a_hung_helper_stops_training_with_helper_failed(runs) -> None:
    run = runs(mode="secure", steps=100_000)
    assert run.helper is not None
    steps, _dropped, _back = hang_a_node(run)
    with stopped(run.helper):
        steps += run.steps(lambda e: e["event"] == "tlpp.error", kinds=("tlpp.step", "tlpp.error"))
    error = steps.pop()
    exited = run.orch.wait_event(lambda e: e["event"] == "exited", also=run.procs)

    check_ledgers(steps)
    assert all(e["applied"] for e in steps[-3:]), steps[-3:]
    assert error["kind"] == "HelperFailed" and f"no response within {HELPER_TIMEOUT_S} s" in error["message"], error
    assert error["step"] == steps[-1]["step"] + 1, "it stopped in the step after the last one it applied"
    assert exited["code"] == 1 and f"error: role tlpp-orchestrator failed: tlpp-orchestrator: {error['message']}" in run.orch.log()
    state = unpack_state(load_file(run.work / "ckpt" / "hang-secure-tlpp-state.safetensors"))
    assert state["step"] == error["step"] and Path(error["checkpoint"]).is_file()
    assert state["version"] == sum(e["applied"] for e in steps), "the stopped step applied nothing"


def node_status(node: GossamerProcess) -> dict:
    with urllib.request.urlopen(f"http://{node.latest['ready']['http']}/status", timeout=10) as response:
        roles = json.loads(response.read())["role_status"]
    return {k: v for k, v in roles["node"].items() if k in ("steps_served", "last_step", "weights_version")}
