"""Context parallelism through the CLI on 127.0.0.1: ``gossamer orchestrator`` and four ``gossamer
peer --roles cp-shard`` processes form a ring (shards that start later join it at a step
boundary) of four and train (the loss falls); one shard is
SIGKILLed mid-run: the leader's ledger names it (an aborted step, or a plan or update it could not
deliver), no process hangs, and the three survivors go on as a ring of three with a shorter
context; Ctrl+C stops each cleanly. And the ``context`` preset, run as its README shows it, to
its end: every shard finishes and exits by itself."""

from __future__ import annotations

import re
import signal
import statistics
from pathlib import Path

import pytest

from gossamer_harness.localproc import LOOPBACK, GossamerProcess, Processes, gossamer

# Every wait follows the processes' progress; the limit is the last resort (each test takes one to
# two minutes at load 2, and many times that on a machine as loaded as a busy CI host)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

STEPS = 60  # the leader's steps before the test stops the run (at least)
SURVIVOR_STEPS = 10  # steps the ring of three trains after the kill (at least)
CHUNK = 32
RUN = f"""
[run]
name = "ring"
protocol = "context"
heartbeat_s = 1.0
[model]
d_model = 32
n_layers = 2
n_heads = 2
context = 128
[model.subspace]
rank = 2
[hyper]
chunk_tokens = {CHUNK}
batch_size = 4
min_shards = 2
steps = {{steps}}
lr = 0.01
step_timeout_s = 15.0
plan_timeout_s = 15.0
"""


def start(processes: Processes, work: Path, name: str, args: list[str]) -> GossamerProcess:
    return processes.start([*args, "--events", *LOOPBACK, "--threads", "1", "--identity_path", str(work / f"{name}.pem"),
                            "--checkpoint_dir", str(work / "ckpt")], log_path=work / f"{name}.log")


def named(ledger: dict, peer_id: str) -> bool:
    return peer_id in ledger["suspects"] or peer_id in ledger["reduce"]["send_failures"]


def next_event(leader: GossamerProcess, others: list[GossamerProcess], *kinds: str) -> dict:
    """The leader's next event of ``kinds``, for as long as the ring makes progress; the other
    shards' events are read meanwhile (they are queued, so no shard ever blocks on a full stdout
    pipe)."""
    return leader.wait_event(lambda e: e["event"] in kinds, also=others)


def test_four_shards_train_and_the_survivors_of_a_kill_go_on_shorter(processes: Processes, tmp_path: Path) -> None:
    # no step limit: at load 16 the first two shards once ran all 40 steps before the other two had
    # joined the ring; the run ends with Ctrl+C (the context preset below runs to its end)
    (tmp_path / "run.toml").write_text(RUN.format(steps=0))
    orch = start(processes, tmp_path, "orch", ["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm"])
    ready = orch.wait_ready()
    join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
    shards = [start(processes, tmp_path, f"shard{i}", ["peer", *join, "--roles", "cp-shard"]) for i in range(4)]
    ids = [shard.wait_ready()["peer_id"] for shard in shards]
    leader = shards[ids.index(min(ids))]
    others = [shard for shard in shards if shard is not leader]
    early = [next_event(leader, others, "context.step")]
    while len([e for e in early if e["chunks"] == 4]) < 5:  # the others join at step boundaries
        early.append(next_event(leader, others, "context.step"))
    assert early[-1]["members"] == sorted(ids) and early[-1]["context"] == 4 * CHUNK

    dead = sorted(ids)[2]
    victim = shards[ids.index(dead)]
    before_kill = victim.drain()
    victim.stop(signal.SIGKILL)
    survivors = [shard for shard in others if shard is not victim]
    after = [next_event(leader, survivors, "context.step", "context.aborted")]
    while len([e for e in after if e["event"] == "context.step" and e["chunks"] == 3]) < SURVIVOR_STEPS \
            or after[-1].get("step", 0) < STEPS - 1:  # 60 steps in all, as the loss needs
        after.append(next_event(leader, survivors, "context.step", "context.aborted"))

    assert any(named(ledger, dead) for ledger in after), [e["event"] for e in after]
    assert all(e["applied"] is False and e["aborted"] for e in after if e["event"] == "context.aborted")
    applied = [e for e in after if e["event"] == "context.step"]
    steps = [e["step"] for e in early + applied]
    assert steps == sorted(set(steps)), steps  # the leader never runs a step twice
    last = applied[-1]
    assert last["chunks"] == 3 and last["context"] == 3 * CHUNK and dead not in last["members"]
    # the ring's loss per step, from every shard's events: on a loaded host the lowest id (the
    # leader at the end) may have joined a ring that had trained for a while without it
    loss_at = {e["step"]: e["loss"] for e in [*before_kill, *(e for shard in survivors for e in shard.drain())]
               if e["event"] == "context.step"}
    loss_at.update({e["step"]: e["loss"] for e in early + applied})
    # no step lost: the ring's steps, from any shard, run on without a gap. The leader's own may
    # skip some: on a loaded host its record can lapse, the others step on without it, and it
    # catches up from their state (its log says "now at step N")
    assert sorted(loss_at) == list(range(min(loss_at), max(loss_at) + 1)), sorted(loss_at)
    losses = [loss_at[step] for step in sorted(loss_at)]
    assert min(loss_at) == 0 and statistics.mean(losses[-5:]) < statistics.mean(losses[:5]) - 0.3, losses
    live = [leader, *survivors]
    for shard in live:  # signal all first: they shut down side by side
        shard.proc.send_signal(signal.SIGINT)
    assert [shard.stop(sig=0, timeout_s=300) for shard in live] == [0, 0, 0], "Ctrl+C stops each cleanly"
    for shard in live:  # each wrote what a restart resumes from
        assert "cp-shard: checkpoint written to" in shard.log_path.read_text()


def test_the_context_preset_trains_a_ring_of_four_and_exits_cleanly(tmp_path: Path) -> None:
    """``gossamer swarm --preset context``, as protocols/context/README.md shows it."""
    result = gossamer(["swarm", "--preset", "context", "--workdir", str(tmp_path)])
    out = result.stdout
    assert result.returncode == 0, out[-5000:] + result.stderr[-3000:]
    assert "the run is finished (all 4 peers)" in out and "stopped 5 process(es) cleanly" in out
    steps = [(int(step), float(loss), int(chunks)) for step, loss, chunks in
             re.findall(r"step (\d+): loss (\d+\.\d+)  chunk \d of (\d) \(\d+-token context\).*\(leader\)", out)]
    assert [step for step, _, _ in steps] == list(range(steps[0][0], 60)) and steps[-1][2] == 4, steps
    losses = [loss for _, loss, _ in steps]
    assert statistics.mean(losses[-5:]) < statistics.mean(losses[:5]) - 1.0, losses
    heldout = [float(x) for x in re.findall(r"finished at step 60: held-out loss (\d+\.\d+) at 256 tokens", out)]
    assert len(heldout) == 4 and len(set(heldout)) == 1, heldout  # one model on every shard
    assert len(list((tmp_path / "checkpoints").glob("context-demo-*-step60.safetensors"))) == 4
