"""TL++ through the CLI on 127.0.0.1: ``gossamer orchestrator``, ``gossamer helper`` and
``gossamer peer --roles node --data ...`` as separate processes. Base mode trains (the loss falls)
and goes on when a node is SIGKILLed mid-run (the ledger records it), also once its record has
expired (``min_nodes`` gates the start only); secure mode trains, the
servers' share logs show that neither ever received both shares of any tensor, and a SIGKILLed
helper stops secure training with a clear error instead of a hang: the orchestrator writes its
checkpoint and exits with code 1."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

import pytest

from gossamer_harness.localproc import LOOPBACK, GossamerProcess, Processes
from gossamer_harness.tlpp.runs import BASE_NODE_COMMAND, secure_tables

# Every wait follows the processes' progress; the limit is the last resort (each test takes about a
# minute at load 2, and many times that on a machine as loaded as a busy CI host)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

RUN = """
[run]
name = "{name}"
protocol = "tlpp"
heartbeat_s = 1.0
[model]
cut = 3
[hyper]
mode = "{mode}"
batch_size = 32
optimizer = "adam"
lr = 0.01
steps = {steps}
eval_every = 20
min_nodes = 3
node_timeout_s = 10.0
helper_timeout_s = 5.0
helper_wait_s = 2.0
"""


def start(processes: Processes, work: Path, name: str, args: list[str],
          share_log: Path | None = None) -> GossamerProcess:
    return processes.start([*args, "--events", *LOOPBACK, "--threads", "1", "--identity_path", str(work / f"{name}.pem"),
                            "--checkpoint_dir", str(work / "ckpt"), *(["--share_log", str(share_log)] if share_log else [])],
                           log_path=work / f"{name}.log")


def start_run(processes: Processes, work: Path, *, mode: str, steps: int,
              share_logs: bool = False) -> tuple[GossamerProcess, dict, list[GossamerProcess]]:
    tables, node_command = secure_tables(work, [f"node{i}" for i in range(3)]) if mode == "secure" else \
        ("", BASE_NODE_COMMAND)
    (work / "run.toml").write_text(RUN.format(name=f"tl-{mode}", mode=mode, steps=steps) + tables)
    orch = start(processes, work, "orch", ["orchestrator", "-c", str(work / "run.toml"), "--new_swarm"],
                 work / "orch-shares.jsonl" if share_logs else None)
    ready = orch.wait_ready()
    join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
    procs = []
    if mode == "secure":
        procs.append(start(processes, work, "helper", ["helper", *join], work / "helper-shares.jsonl"))
    procs += [start(processes, work, f"node{i}", [*node_command, *join, "--data", f"builtin:digits:shard={i}/3"])
              for i in range(3)]
    for proc in procs:
        proc.wait_ready()
    return orch, ready, procs


def step_event(orch: GossamerProcess, at_least: int, peers: list[GossamerProcess]) -> dict:
    """The orchestrator's first step event from step ``at_least`` on (as long as it or its peers
    make progress)."""
    return orch.wait_event(lambda e: e["event"] == "tlpp.step" and e["step"] >= at_least, also=peers)


def http_get(address: str, path: str) -> str:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=60) as response:
        return response.read().decode()


def test_base_mode_trains_and_goes_on_when_a_node_is_killed(processes: Processes, tmp_path: Path) -> None:
    orch, ready, nodes = start_run(processes, tmp_path, mode="base", steps=60)
    first = step_event(orch, 0, nodes)
    killed_id = nodes[2].latest["ready"]["peer_id"]
    before = step_event(orch, 5, nodes)
    nodes[2].stop(signal.SIGKILL)
    survivors = nodes[:2]
    steps = [orch.wait_event(lambda e: e["event"] in ("tlpp.step", "tlpp.finished"), also=survivors)]
    while steps[-1]["event"] != "tlpp.finished":
        steps.append(orch.wait_event(lambda e: e["event"] in ("tlpp.step", "tlpp.finished"), also=survivors))
    finished, steps = steps[-1], steps[:-1]
    dropped = [e for e in steps if e["rejected"]]
    assert dropped, "the killed node must show up as dropped in a step's ledger"
    gone = set(dropped[0]["rejected"])
    assert gone == {killed_id} and killed_id in before["used"], dropped[0]
    assert all(e["applied"] for e in steps), "every step after the kill still applies a gradient"
    # the killed node is gone for good; both survivors still train at the end (a survivor
    # that missed a step on a loaded host is scheduled again once its record is renewed)
    survivor_ids = {n.latest["ready"]["peer_id"] for n in survivors}
    assert all(set(e["used"]) <= survivor_ids for e in steps[-5:]), steps[-5:]
    assert set().union(*(e["used"] for e in steps[-5:])) == survivor_ids, steps[-8:]
    assert finished["step"] == 60 and Path(finished["checkpoint"]).is_file()
    assert finished["test_loss"] < first["loss"] - 0.3, (first["loss"], finished["test_loss"])
    metrics = http_get(ready["http"], "/metrics")
    assert 'gossamer_bytes_sent_total{kind="tlpp_forward"}' in metrics, metrics[-2000:]
    assert 'gossamer_bytes_received_total{kind="tlpp_backward"}' in metrics


def test_base_mode_goes_on_after_the_killed_nodes_record_expired(processes: Processes, tmp_path: Path) -> None:
    """``min_nodes`` (3 here) gates the start only: once the killed node's record has left the
    orchestrator's view, 2 nodes live, the run trains on with them instead of going back to
    "waiting for TL++ nodes" for good. The run's last step is out of reach, so it is still training
    when the record expires however fast the machine (at 60 steps it could finish first)."""
    orch, _ready, nodes = start_run(processes, tmp_path, mode="base", steps=1_000_000)
    step_event(orch, 5, nodes)
    killed = nodes[2].latest["ready"]["peer_id"]
    nodes[2].stop(signal.SIGKILL)
    orch.wait_event(lambda e: e["event"] == "peers" and killed not in e["peer_ids"], also=nodes[:2])
    after = [orch.wait_event(lambda e: e["event"] == "tlpp.step", also=nodes[:2]) for _ in range(10)]
    survivors = {n.latest["ready"]["peer_id"] for n in nodes[:2]}
    summary = [(e["step"], e["applied"], sorted(p[:8] for p in e["used"])) for e in after]
    assert all(e["applied"] and e["used"] and set(e["used"]) <= survivors for e in after), summary


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_secure_mode_trains_no_server_sees_both_shares_and_a_dead_helper_stops_it(
        processes: Processes, tmp_path: Path) -> None:
    orch, _ready, procs = start_run(processes, tmp_path, mode="secure", steps=1000, share_logs=True)
    helper, nodes = procs[0], procs[1:]
    first = step_event(orch, 0, procs)
    evaluation = orch.wait_event(lambda e: e["event"] == "tlpp.eval" and e["step"] >= 40, also=procs)
    assert evaluation["loss"] < first["loss"] - 0.3, (first["loss"], evaluation)
    helper.stop(signal.SIGKILL)
    error = orch.wait_event(lambda e: e["event"] == "tlpp.error", also=nodes)
    assert error["kind"] == "HelperFailed" and "helper" in error["message"], error
    assert Path(error["checkpoint"]).is_file()
    exited = orch.wait_event(lambda e: e["event"] == "exited", also=nodes)
    assert exited["code"] == 1, "a failed role ends the orchestrator with a non-zero exit code"
    assert f"error: role tlpp-orchestrator failed: tlpp-orchestrator: {error['message']}" in orch.log()
    processes.close()  # the share logs are complete
    at_orchestrator = read_log(tmp_path / "orch-shares.jsonl")
    at_helper = read_log(tmp_path / "helper-shares.jsonl")
    assert at_orchestrator and at_helper
    assert {e["share_index"] for e in at_orchestrator} == {0}, "the orchestrator only ever received share 0"
    assert {e["share_index"] for e in at_helper} == {1}, "the helper only ever received share 1"
    for log in (at_orchestrator, at_helper):
        seen: dict[tuple, set[int]] = {}
        for e in log:
            seen.setdefault((e["step"], e["node"], e["tensor"]), set()).add(e["share_index"])
        assert all(len(indices) == 1 for indices in seen.values())
    # Nodes push share 1 beside their answer, so only the steps before the one the helper died in
    # are complete at both servers; and a node whose push did not reach the helper (e.g. at step 0,
    # before the node saw the helper in its view) is dropped from that step, so it has nothing there.
    last = max(e["step"] for e in at_orchestrator)
    at_helper_by_step: dict[int, set[str]] = {}
    for e in at_helper:
        at_helper_by_step.setdefault(e["step"], set()).add(e["node"])
    complete = {e["step"] for e in at_orchestrator if e["step"] < last}
    assert all(at_helper_by_step.get(step) for step in complete if step > 0), "every complete step reached the helper"
    held = {(e["step"], e["node"], e["tensor"]) for e in at_orchestrator
            if e["step"] < last and e["node"] in at_helper_by_step.get(e["step"], set())}
    assert {(e["step"], e["node"], e["tensor"]) for e in at_helper} >= held
    assert {e["tensor"] for e in at_orchestrator} == {"act", "grads"}  # gradient shares: one flat vector
