"""Gossip-DiLoCo learners as real daemons through the CLI on 127.0.0.1: the held-out loss falls;
a learner SIGKILLed mid-run is recorded as failed while the others finish their rounds; a
sign-flipping learner does not stop the honest ones under centered clipping."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from crypto.identity import Identity
from peer.localproc import LOOPBACK, GossamerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN = """
[run]
name = "{name}"
protocol = "diloco"
heartbeat_s = 1.0
[model]
d_model = 32
n_layers = 1
n_heads = 2
context = 32
[hyper]
rounds = {rounds}
batch_size = 16
w1_grace_s = 1.0
w2_deadline_s = 8.0
eval_batches = 2
[hyper.diloco]
inner_steps = 15
inner_lr = 0.005
[hyper.mixing]
w1 = "global"
w2 = "global"
[hyper.aggregator]
name = "{aggregator}"
"""


def start_run(work: Path, *, name: str, learners: int, rounds: int, aggregator: str,
              attacks: dict[int, str] | None = None) -> tuple[GossamerProcess, list[GossamerProcess], list[str]]:
    (work / "run.toml").write_text(RUN.format(name=name, rounds=rounds, aggregator=aggregator))
    orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                            "--identity_path", str(work / "owner.pem")], log_path=work / "orch.log")
    ready = orch.wait_ready()
    ids, procs = [], []
    for i in range(learners):
        ids.append(Identity.create(work / f"l{i}.pem").peer_id)
        attack = ["--attack", attacks[i]] if attacks and i in attacks else []
        procs.append(GossamerProcess(
            ["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--roles", "learner", "--events",
             *LOOPBACK, "--threads", "1", "--identity_path", str(work / f"l{i}.pem"), "--checkpoint_dir",
             str(work / "ckpt"), *attack], log_path=work / f"l{i}.log"))
    for proc in procs:
        proc.wait_ready()
    return orch, procs, ids


def rounds_of(proc: GossamerProcess, count: int, *, timeout_s: float = 200) -> list[dict]:
    return [proc.wait_event(lambda e: e["event"] == "round", timeout_s=timeout_s) for _ in range(count)]


def test_learners_train_and_a_killed_learner_is_recorded_as_failed(tmp_path: Path) -> None:
    orch, procs, ids = start_run(tmp_path, name="kill", learners=4, rounds=5, aggregator="mean")
    try:
        first = [proc.wait_event(lambda e: e["event"] == "round", timeout_s=200) for proc in procs]
        assert all(len(e["timed_out"]) == 0 or e["round"] == 0 for e in first)
        procs[3].stop(signal.SIGKILL)
        later = [rounds_of(proc, 4) for proc in procs[:3]]
        for events in later:
            failed = {peer for e in events for peer in e["timed_out"]}
            assert ids[3] in failed, "the killed learner must be recorded as failed in some round"
            assert events[-1]["heldout_loss"] < first[0]["heldout_loss"] - 0.1
        for proc in procs[:3]:
            finished = proc.wait_event(lambda e: e["event"] == "finished", timeout_s=60)
            assert Path(finished["checkpoint"]).is_file() and finished["round"] == 5
    finally:
        for proc in [*procs, orch]:
            proc.stop()


def test_sign_flipping_learner_does_not_stop_honest_learners(tmp_path: Path) -> None:
    orch, procs, _ids = start_run(tmp_path, name="byz", learners=4, rounds=4, aggregator="centered_clipping",
                                 attacks={3: "sign_flip:10"})
    try:
        for proc in procs[:3]:
            events = rounds_of(proc, 4)
            assert events[-1]["heldout_loss"] < events[0]["heldout_loss"] - 0.1
            assert events[-1]["heldout_loss"] < 4.5
    finally:
        for proc in [*procs, orch]:
            proc.stop()
