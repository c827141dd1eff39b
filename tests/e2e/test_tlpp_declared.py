"""TL++ on a declared model over 28x28 images through the CLI, as separate processes: the run
owner declares the stages in the run config, each data owner brings an .npz file, the nodes
publish only per-channel counts and sums and the orchestrator pools them into the input
normalisation; base and secure mode train every step on both nodes. A node whose data does not
fit the declared input refuses to start with one line naming the shape the run expects."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gossamer_harness.localproc import LOOPBACK, Processes, gossamer
from tests.e2e.test_tlpp import secure_tables, start
from tests.protocols.tlpp.harness import digits_28

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # the waits follow progress: this is the last resort

STEPS = 8
RUN = """
[run]
name = "declared-{mode}"
protocol = "tlpp"
heartbeat_s = 1.0
[model]
input_shape = [1, 28, 28]
num_classes = 10
stages = [
  ["conv 8", "relu", "maxpool 2"],
  ["conv 16", "relu", "maxpool 2"],
  ["flatten", "linear 32", "relu"],
  ["linear 10"],
]
[data]
normalize = "nodes"
test = {test}
[hyper]
mode = "{mode}"
batch_size = 32
optimizer = "adam"
lr = 0.01
steps = {steps}
eval_every = 0
min_nodes = 2
node_timeout_s = 10.0
helper_timeout_s = 10.0
helper_wait_s = 5.0
"""


@pytest.mark.parametrize("mode", ["base", "secure"])
def test_a_declared_model_trains_on_28x28_npz_files_brought_by_the_data_owners(processes: Processes, tmp_path: Path,
                                                                             mode: str) -> None:
    owners = digits_28(tmp_path, owners=3)
    tables, node_command = secure_tables(tmp_path, ["node0", "node1"]) if mode == "secure" else \
        ("", ["peer", "--roles", "node"])
    (tmp_path / "run.toml").write_text(RUN.format(mode=mode, test=json.dumps(owners[2]), steps=STEPS) + tables)
    orch = start(processes, tmp_path, "orch", ["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm"])
    ready = orch.wait_ready()
    join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
    procs = [start(processes, tmp_path, "helper", ["helper", *join])] if mode == "secure" else []
    procs += [start(processes, tmp_path, f"node{i}", [*node_command, *join, "--data", owners[i]]) for i in range(2)]
    node_ids = sorted(proc.wait_ready()["peer_id"] for proc in procs[-2:])
    normalized = orch.wait_event(lambda e: e["event"] == "tlpp.normalized", also=procs)
    steps = [orch.wait_event(lambda e: e["event"] == "tlpp.step", also=procs) for _ in range(STEPS)]
    finished = orch.wait_event(lambda e: e["event"] == "tlpp.finished", also=procs)
    processes.close()

    union = np.concatenate([np.load(path)["x"] for path in owners[:2]]).astype(np.float64)
    assert normalized["nodes"] == node_ids and normalized["samples"] == len(union)
    assert normalized["mean"] == pytest.approx([union.mean()], abs=1e-6)
    assert normalized["std"] == pytest.approx([union.std()], abs=1e-6)
    assert [e["step"] for e in steps] == list(range(STEPS)) and all(e["mode"] == mode for e in steps)
    for e in steps:  # a step applies a gradient when it used a node, and accounts for each node it planned
        # (a node dropped from a step leaves the schedule until the epoch ends: a later step may plan one;
        # secure mode: a step left with one node, below k = 2, reveals nothing and its note says so)
        assert e["applied"] == bool(e["used"]), e
        assert sorted([*e["used"], *e["rejected"]]) == sorted(e["expected"]) or "fewer than min_sum_nodes" in e["note"], e
        assert set(e["expected"]) <= set(node_ids), e
    if mode == "base":
        assert all(e["used"] == node_ids for e in steps), steps
    else:  # a node whose share 1 lost the race with the helper's wait (e.g. at step 0, before it saw the
        # helper) is left out of that step, never half-used; both nodes train
        assert all("the helper holds no matching activation share" in r for e in steps for r in e["rejected"].values())
        assert set().union(*(e["used"] for e in steps)) == set(node_ids), steps
    applied = [e for e in steps if e["applied"]]
    assert finished["step"] == STEPS and finished["applied_steps"] == len(applied)
    if mode == "base":
        assert len(applied) == STEPS
    assert finished["test_loss"] < applied[0]["loss"], (applied[0]["loss"], finished["test_loss"])
    checkpoint = load_file(finished["checkpoint"])
    assert checkpoint["0.0.std"].flatten().tolist() == pytest.approx([union.std()], rel=1e-6)
    assert checkpoint["1.0.weight"].shape == (16, 8, 3, 3) and checkpoint["2.1.weight"].shape == (32, 16 * 7 * 7)
    assert torch.isfinite(checkpoint["3.0.weight"]).all()


def test_a_node_whose_data_does_not_fit_the_declared_input_refuses_to_start(processes: Processes,
                                                                           tmp_path: Path) -> None:
    owners = digits_28(tmp_path, owners=3)
    np.savez(tmp_path / "eight.npz", x=np.zeros((5, 8, 8)), y=np.zeros(5, dtype=int))
    (tmp_path / "run.toml").write_text(RUN.format(mode="base", test=json.dumps(owners[2]), steps=STEPS))
    orch = start(processes, tmp_path, "orch", ["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm"])
    ready = orch.wait_ready()
    result = gossamer(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], *LOOPBACK,
                       "--roles", "node", "--data", str(tmp_path / "eight.npz"),
                       "--identity_path", str(tmp_path / "node.pem")])
    processes.close()
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and len(errors) == 1, result.stderr[-2000:]
    assert "x has shape [5, 8, 8]; this run's model takes x of shape [N, 1, 28, 28] or [N, 28, 28]" in errors[0]
