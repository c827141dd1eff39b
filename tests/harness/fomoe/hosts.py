"""FoMoE expert hosts as real daemons through the CLI on 127.0.0.1: ``RUN`` (four experts, r = 2,
no round limit, so the hosts are live when ``gossamer status`` reads their records) and
``kill_one_host``, the scenario ``tests/e2e/test_expert_hosts.py`` and
``scripts/chaos/fomoe_hosts.py`` run; every process it starts is stopped before it returns."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gossamer.crypto.identity import Identity
from gossamer.transport.safetensors_stream import load_file
from gossamer_harness.localproc import LOOPBACK, GossamerProcess

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


def _start_host(work: Path, ready: dict, index: int) -> tuple[GossamerProcess, str]:
    peer_id = Identity.create(work / f"h{index}.pem").peer_id
    proc = GossamerProcess(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--roles",
                            "expert-host", "--events", *LOOPBACK, "--threads", "1", "--identity_path",
                            str(work / f"h{index}.pem"), "--checkpoint_dir", str(work / "ckpt")],
                           log_path=work / f"h{index}.log")
    return proc, peer_id


def kill_one_host(work: Path) -> dict[str, Any]:
    """Four hosts; one SIGKILLed after round 0; the three left re-place its experts (none lost,
    every expert again on two), name it timed out (or its update rejected) and go on training with
    the held-out loss falling; ``gossamer status`` shows every expert with two live holders and three members;
    Ctrl+C stops each survivor cleanly, and their written parts hold every expert. AssertionError
    names the first check that fails; returns the losses seen."""
    (work / "run.toml").write_text(RUN)
    orch = GossamerProcess(["orchestrator", "-c", str(work / "run.toml"), "--new_swarm", "--events", *LOOPBACK,
                            "--identity_path", str(work / "owner.pem")], log_path=work / "orch.log")
    procs: list[GossamerProcess] = []
    ids: list[str] = []
    try:
        ready = orch.wait_ready()
        for index in range(4):  # each is in procs as soon as it runs: the finally stops it
            proc, peer_id = _start_host(work, ready, index)
            procs.append(proc)
            ids.append(peer_id)
        first = [proc.wait_event(lambda e: e["event"] == "fomoe.round", timeout_s=240) for proc in procs]
        assert all(e["members"] == 4 and len(e["experts"]) == 2 for e in first), first
        for proc in procs:  # everyone is past round 0 before the kill
            proc.wait_event(lambda e: e["event"] == "fomoe.round" and e["round"] >= 1, timeout_s=120)
        procs[3].stop(signal.SIGKILL)

        rounds: dict[int, list[dict]] = {i: [] for i in range(3)}

        def placed_without_h3(index: int) -> Callable[[dict], bool]:
            def match(event: dict) -> bool:
                if event["event"] == "fomoe.round":
                    rounds[index].append(event)
                return event["event"] == "fomoe.placement" and event["members"] == 3
            return match

        for index, proc in enumerate(procs[:3]):
            placed = proc.wait_event(placed_without_h3(index), timeout_s=180)
            assert placed["lost"] == [] and len(placed["holders"]) == 4, placed
            assert all(h == 2 for h in placed["holders"]), placed  # r = 2 on the three survivors
            rounds[index].append(proc.wait_event(lambda e: e["event"] == "fomoe.round", timeout_s=60))
            # h3 is left out of a round: timed out if it died before its update reached this host,
            # rejected ("not every member got it") if the update arrived but h3 died before the round agreed
            assert any(ids[3] in e["timed_out"] or ids[3] in e["rejected"] for e in rounds[index]), rounds[index]
        status = subprocess.run([sys.executable, "-m", "gossamer.peer.cli", "status", "--run", ready["run_id"],
                                 "--initial_peers", *ready["maddrs"], "--timeout_s", "30"],
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        assert "experts: 4 expert(s), r = 2" in status.stdout and "NO LIVE HOLDER" not in status.stdout, status.stdout
        assert "3 member(s)" in status.stdout, status.stdout  # the killed host's last record is not counted
        later_losses = []
        for index, proc in enumerate(procs[:3]):  # two more rounds among the three: still learning
            after = rounds[index][-1]["round"]
            later = proc.wait_event(lambda e, after=after: e["event"] == "fomoe.round" and e["round"] >= after + 2,
                                    timeout_s=180)
            assert later["members"] == 3 and later["used"] == 2 and not later["timed_out"], later
            assert later["heldout_loss"] < min(e["heldout_loss"] for e in first) - 0.1, (first, later)
            later_losses.append(later["heldout_loss"])
        assert [proc.stop(signal.SIGINT, timeout_s=60) for proc in procs[:3]] == [0, 0, 0]
        held: set[int] = set()  # Ctrl+C wrote each survivor's part: dense layers and its experts (the
        for peer_id in ids[:3]:  # last ones stopped may hold more: they re-placed without the first)
            (path,) = (work / "ckpt").glob(f"experts-{peer_id[:12]}-round*.safetensors")
            tensors, metadata = load_file(path)
            experts = {int(e) for e in metadata["experts"].split(",")}
            assert len(experts) >= 2 and "embed.weight" in tensors
            assert all(any(f".experts.{e}." in name for name in tensors) for e in experts), sorted(tensors)
            held |= experts
        assert held == {0, 1, 2, 3}, held
        return {"first_heldout": [e["heldout_loss"] for e in first], "later_heldout": later_losses,
                "experts_held_after": sorted(held)}
    finally:
        for proc in [*procs, orch]:
            proc.stop()
