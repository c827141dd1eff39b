"""FoMoE expert hosts as real daemons through the CLI on 127.0.0.1: four hosts (four experts,
r = 2) train with the held-out loss falling; one is SIGKILLed, and the other three re-place its
experts among themselves with none lost and go on training; ``gossamer status`` shows every
expert with two live holders; Ctrl+C stops each host cleanly, writing its part. The run has no round limit
(``rounds = 0``) so the hosts are still live when ``status`` reads their records. The preset run
(``gossamer swarm --preset fomoe``, 8 rounds, checkpoints of every expert in two) and a longer
kill are ``scripts/chaos/fomoe_hosts.py``."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gossamer.crypto.identity import Identity
from gossamer.peer.testing.localproc import LOOPBACK, GossamerProcess
from gossamer.transport.safetensors_stream import load_file

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
RUN = """
[run]
name = "experts"
protocol = "fomoe"
heartbeat_s = 5.0
[model]
d_model = 32
n_layers = 1
n_heads = 2
context = 32
n_experts = 4
top_k = 2
[hyper]
rounds = 0
batch_size = 16
eval_batches = 2
min_hosts = 4
update_deadline_s = 60.0
commit_deadline_s = 30.0
[hyper.diloco]
inner_steps = 10
inner_lr = 0.005
[hyper.fomoe]
replication = 2
"""


def start_host(work: Path, ready: dict, index: int) -> tuple[GossamerProcess, str]:
    peer_id = Identity.create(work / f"h{index}.pem").peer_id
    proc = GossamerProcess(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--roles",
                            "expert-host", "--events", *LOOPBACK, "--threads", "1", "--identity_path",
                            str(work / f"h{index}.pem"), "--checkpoint_dir", str(work / "ckpt")],
                           log_path=work / f"h{index}.log")
    return proc, peer_id


def test_four_hosts_train_and_a_killed_one_is_re_placed_with_no_expert_lost(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN)
    orch = GossamerProcess(["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                            "--identity_path", str(tmp_path / "owner.pem")], log_path=tmp_path / "orch.log")
    procs: list[GossamerProcess] = []
    try:
        ready = orch.wait_ready()
        started = [start_host(tmp_path, ready, i) for i in range(4)]
        procs = [proc for proc, _ in started]
        ids = [peer_id for _, peer_id in started]
        first = [proc.wait_event(lambda e: e["event"] == "fomoe.round", timeout_s=240) for proc in procs]
        assert all(e["members"] == 4 and len(e["experts"]) == 2 for e in first), first
        for proc in procs:  # everyone is past round 0 before the kill
            proc.wait_event(lambda e: e["event"] == "fomoe.round" and e["round"] >= 1, timeout_s=120)
        procs[3].stop(signal.SIGKILL)

        rounds: dict[int, list[dict]] = {i: [] for i in range(3)}

        def placed_without_h3(index: int):
            def match(event: dict) -> bool:
                if event["event"] == "fomoe.round":
                    rounds[index].append(event)
                return event["event"] == "fomoe.placement" and event["members"] == 3
            return match

        for index, proc in enumerate(procs[:3]):
            placed = proc.wait_event(placed_without_h3(index), timeout_s=180)
            assert placed["lost"] == [] and len(placed["holders"]) == 4, placed
            assert all(h == 2 for h in placed["holders"]), placed  # r = 2 on the three survivors
            rounds[index].append(proc.wait_event(lambda e: e["event"] == "fomoe.round", timeout_s=60))  # that round's
            assert any(ids[3] in e["timed_out"] for e in rounds[index]), rounds[index]
        status = subprocess.run([sys.executable, "-m", "gossamer.peer.cli", "status", "--run", ready["run_id"],
                                 "--initial_peers", *ready["maddrs"], "--timeout_s", "30"],
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        assert "experts: 4 expert(s), r = 2" in status.stdout and "NO LIVE HOLDER" not in status.stdout, status.stdout
        assert "3 member(s)" in status.stdout, status.stdout  # the killed host's last record is not counted
        for index, proc in enumerate(procs[:3]):  # two more rounds among the three: still learning
            after = rounds[index][-1]["round"]
            later = proc.wait_event(lambda e, after=after: e["event"] == "fomoe.round" and e["round"] >= after + 2,
                                    timeout_s=180)
            assert later["members"] == 3 and later["used"] == 2 and not later["timed_out"], later
            assert later["heldout_loss"] < min(e["heldout_loss"] for e in first) - 0.1, (first, later)
        assert [proc.stop(signal.SIGINT, timeout_s=60) for proc in procs[:3]] == [0, 0, 0]
        held: set[int] = set()  # Ctrl+C wrote each survivor's part: dense layers and its experts (the
        for peer_id in ids[:3]:  # last ones stopped may hold more: they re-placed without the first)
            (path,) = (tmp_path / "ckpt").glob(f"experts-{peer_id[:12]}-round*.safetensors")
            tensors, metadata = load_file(path)
            experts = {int(e) for e in metadata["experts"].split(",")}
            assert len(experts) >= 2 and "embed.weight" in tensors
            assert all(any(f".experts.{e}." in name for name in tensors) for e in experts), sorted(tensors)
            held |= experts
        assert held == {0, 1, 2, 3}
    finally:
        for proc in [*procs, orch]:
            proc.stop()

