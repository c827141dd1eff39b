"""Joining from behind NAT, for real: network namespaces on one bridge, two of them "NATed" (every
connection opened towards them is dropped, their own outbound ones work). A public orchestrator
volunteers as relay, a public learner and two NATed learners train gossip-DiLoCo together: each
NATed learner finds itself private, takes the relay, and mixes with the public learner and with
the other NATed one through it (``peer.reach``, ``transport.relay``). In a BlockTrain run with no
relay, a NATed ``gossamer generate`` client gets text from a public block server, while a NATed
block server stays private: every view marks it and no route goes through it (``peer.route``).
In a secure TL++ run two NATed data nodes train with a public one: the orchestrator reaches
them only through the relay, and their shares go out to the public helper. A NATed block worker,
with no relay in the run, trains its block (it only dials out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gossamer.crypto.identity import Identity
from gossamer_harness.localproc import GossamerProcess, Processes, gossamer, wait_until
from gossamer_harness.netns import NetLab
from tests.e2e.test_tlpp import RUN as TLPP_RUN

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]  # the waits follow progress: this is the last resort

RUN = """
[run]
name = "nat"
protocol = "diloco"
heartbeat_s = 1.0
[model]
d_model = 16
n_layers = 1
n_heads = 2
context = 16
[hyper]
rounds = 0  # until stopped: the test waits for a round that mixes all three, however long set-up takes
batch_size = 8
w1_grace_s = 1.0
w2_deadline_s = 8.0
eval_batches = 1
min_learners = 3
[hyper.diloco]
inner_steps = 3
[hyper.mixing]
w1 = "global"
w2 = "global"
"""
HOSTS = {"relay": False, "public": False, "nat0": True, "nat1": True}


def on(lab: NetLab, host: str) -> list[str]:
    address = lab.addresses[host]
    return ["--host", address, "--host_maddrs", f"/ip4/{address}/tcp/0", "--events", "--threads", "1"]


@pytest.fixture
def lab():
    why = NetLab.unavailable()
    if why:
        pytest.skip(f"no network namespaces here: {why}")
    lab = NetLab.create(f"gsn{os.getpid() % 100000}", HOSTS)
    yield lab
    lab.aclose()


def test_nated_learners_find_themselves_private_and_train_through_a_relay(lab: NetLab, processes: Processes,
                                                                          tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN)
    orch = processes.start(["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm", "--relay",
                            "--identity_path", str(tmp_path / "owner.pem"), *on(lab, "relay")],
                           log_path=tmp_path / "relay.log", wrapper=lab.wrapper("relay"))
    ready = orch.wait_ready()
    learners: dict[str, GossamerProcess] = {}
    for host in ("public", "nat0", "nat1"):
        Identity.create(tmp_path / f"{host}.pem")
        learners[host] = processes.start(
            ["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"], "--roles", "learner",
             "--identity_path", str(tmp_path / f"{host}.pem"), "--checkpoint_dir", str(tmp_path / "ckpt"),
             *on(lab, host)], log_path=tmp_path / f"{host}.log", wrapper=lab.wrapper(host))
    everyone = processes.started
    for host, proc in learners.items():
        reach = proc.wait_event(lambda e: e["event"] == "reachability" and e["reachability"] != "unknown",
                                also=everyone)
        if host.startswith("nat"):
            assert reach["verdict"] == "private", reach
            relayed = reach if reach["reachability"] == "relayed" else proc.wait_event(
                lambda e: e["event"] == "reachability" and e["reachability"] == "relayed", also=everyone)
            assert relayed["relayed_by"], relayed
        else:
            assert reach["reachability"] == "public", reach
    for host, proc in learners.items():  # a round with both others' parameters and pseudo-gradients
        mixed = proc.wait_event(lambda e: e["event"] == "diloco.round" and e["params_from"] == 2
                                and e["pgrads_used"] == 2, also=everyone)
        assert mixed["timed_out"] == [], (host, mixed)
    assert "this peer is private" in learners["nat0"].log()
    # what `gossamer status` shows a user behind NAT: each learner's reachability in the REACH column
    def reach_column() -> dict[str, str]:  # one snapshot of the DHT: a record may be a heartbeat late
        shown = gossamer(["status", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"]],
                         wrapper=lab.wrapper("nat1"))
        assert shown.returncode == 0, shown.stderr[-2000:]
        lines = shown.stdout.splitlines()
        column = next(line for line in lines if line.startswith("PEER ID")).index("REACH")
        return {line[:12]: line[column:].split()[0] for line in lines[2:] if len(line) > column}

    wanted = {proc.latest["ready"]["peer_id"][:12]: "public" if host == "public" else "relayed"
              for host, proc in learners.items()}
    wait_until(reach_column, lambda shown: all(shown.get(k) == v for k, v in wanted.items()), watching=everyone)


BLOCKTRAIN = """
[run]
name = "{name}"
protocol = "blocktrain"
heartbeat_s = 1.0
[model]
d_model = 16
n_heads = 2
context = 16
num_blocks = 2
[hyper]
"""
BLOCKS = BLOCKTRAIN.format(name="nat-blocks") + """
min_workers = 1  # nobody trains here: the servers serve the blocks' first version
route_timeout_s = 10.0
eval_batches = 0
"""


def status(lab: NetLab, host: str, http_addr: str) -> dict:
    """``/status`` of the peer at ``http_addr``, asked from ``host``'s namespace."""
    fetch = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"
    done = subprocess.run([*lab.wrapper(host), sys.executable, "-c", fetch, f"http://{http_addr}/status"],
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_a_nated_client_generates_through_public_block_servers_and_never_a_private_one(
        lab: NetLab, processes: Processes, tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(BLOCKS)
    orch = processes.start(["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm",
                            "--identity_path", str(tmp_path / "owner.pem"), "--checkpoint_dir", str(tmp_path / "ckpt"),
                            *on(lab, "relay")],
                           log_path=tmp_path / "orch.log", wrapper=lab.wrapper("relay"))
    ready = orch.wait_ready()
    join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
    servers: dict[str, GossamerProcess] = {}
    for host in ("public", "nat1"):  # no relay in this run: the NATed server stays private
        servers[host] = processes.start(["serve", *join, "--identity_path", str(tmp_path / f"{host}.pem"),
                                         *on(lab, host)], log_path=tmp_path / f"{host}.log",
                                        wrapper=lab.wrapper(host))
    everyone = processes.started
    for host, proc in servers.items():  # serving, and (the NATed one) found private: in either order
        def settled(proc: GossamerProcess = proc, host: str = host) -> bool:
            reach = proc.latest.get("reachability", {})
            return "blocktrain.serving" in proc.latest and (host == "public" or reach.get("verdict") == "private")

        proc.wait_event(lambda e, settled=settled: settled(), also=everyone)
    assert servers["nat1"].latest["reachability"]["reachability"] == "private"
    # the public server's view knows which (its block-coverage panel), so the client's will too
    public, private = (servers[h].latest["ready"]["peer_id"][:12] for h in ("public", "nat1"))
    panels = json.dumps(wait_until(lambda: status(lab, "public", servers["public"].latest["ready"]["http"])["panels"],
                                   lambda shown: "(private: not routed)" in json.dumps(shown), watching=everyone))
    assert f"{private} v0 (private: not routed)" in panels and f"{public} v0 (private" not in panels, panels
    generated = gossamer(["generate", *join, "--json", "--new_bytes", "8", "--passes", "2", "--timeout_s", "30",
                          "The "], wrapper=lab.wrapper("nat0"))
    assert generated.returncode == 0, generated.stderr[-2000:]
    result = json.loads(generated.stdout)
    assert result["new_bytes"] == 8 and result["retries"] == 0, result
    assert [addr.split(":")[0] for addr, _ in result["route"]] == [lab.addresses["public"]], result
    assert [addr.split(":")[0] for addr in result["unreachable"]] == [lab.addresses["nat1"]], result




def test_nated_tlpp_nodes_train_in_secure_mode_through_the_relay(lab: NetLab, processes: Processes,
                                                                 tmp_path: Path) -> None:
    """The orchestrator asks every node for its forward pass and backward step (it dials them), so
    a NATed data node is only ever reached through the relay; its shares go out to the public
    helper on its own outbound connection. Two NATed nodes and a public one train to the end."""
    helper = Identity.create(tmp_path / "helper.pem")
    nodes = {"nat0": "node-nat0", "nat1": "node-nat1", "public": "node-public"}
    node_ids = {host: Identity.create(tmp_path / f"{name}.pem") for host, name in nodes.items()}
    keys = [helper.public_key.hex(), *(identity.public_key.hex() for identity in node_ids.values())]
    (tmp_path / "run.toml").write_text(TLPP_RUN.format(name="nat-tlpp", mode="secure", steps=60) + f'helper = "{helper.peer_id}"\n[admission]\npolicy = "allowlist"\n'
                                       f"allow = {json.dumps(keys)}\n")
    orch = processes.start(["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm", "--relay",
                            "--identity_path", str(tmp_path / "owner.pem"), "--checkpoint_dir", str(tmp_path / "ckpt"),
                            *on(lab, "relay")], log_path=tmp_path / "orch.log", wrapper=lab.wrapper("relay"))
    ready = orch.wait_ready()
    join = ["--run", ready["run_id"], "--initial_peers", *ready["maddrs"]]
    processes.start(["helper", *join, "--identity_path", str(tmp_path / "helper.pem"), *on(lab, "public")],
                    log_path=tmp_path / "helper.log", wrapper=lab.wrapper("public"))
    everyone = processes.started
    started: dict[str, GossamerProcess] = {}
    # the NATed nodes first, and the third (which lets min_nodes = 3 start the run) once both
    # are relayed: a record published before its peer's first self-test says "unknown" and
    # carries its direct addresses, so a step planned in that second would dial them and lose
    # the node for one step (ledger: "cannot reach"), as it does for a node that moved
    for host, name in nodes.items():
        if host == "public":
            for nated in ("nat0", "nat1"):
                started[nated].wait_event(lambda e: e["event"] == "reachability" and e["reachability"] == "relayed",
                                          also=everyone)
        started[host] = processes.start(
            ["node", "--helper", helper.peer_id, *join, "--data", f"builtin:digits:shard={len(started)}/3",
             "--identity_path", str(tmp_path / f"{name}.pem"), *on(lab, host)],
            log_path=tmp_path / f"{name}.log", wrapper=lab.wrapper(host))
    ids = {host: identity.peer_id for host, identity in node_ids.items()}
    first = orch.wait_event(lambda e: e["event"] == "tlpp.step", also=everyone)
    steps = [first]
    while steps[-1]["event"] != "tlpp.finished":
        steps.append(orch.wait_event(lambda e: e["event"] in ("tlpp.step", "tlpp.finished"), also=everyone))
    finished, steps = steps[-1], steps[:-1]
    # every node, the two behind NAT included, answered the orchestrator's requests in the same step
    assert any(set(e["used"]) == set(ids.values()) for e in steps), [e["used"] for e in steps]
    assert all(e["applied"] for e in steps), json.dumps([e for e in steps if not e["applied"]])
    assert finished["step"] == 60 and finished["test_loss"] < first["loss"] - 0.3, (first, finished)


WORKERS = BLOCKTRAIN.format(name="nat-workers") + """
versions = 3
local_steps = 3
batch_size = 8
deadline_s = 20.0
eval_batches = 1
min_workers = 2
"""


def test_a_nated_block_worker_pulls_its_block_and_its_updates_are_used(lab: NetLab, processes: Processes,
                                                                       tmp_path: Path) -> None:
    """A block worker only ever dials out (it fetches its block from the coordinator and posts
    its update there), so behind NAT, with no relay in the run, it trains as a public one does:
    every version of its block uses its update, and the run finishes."""
    (tmp_path / "run.toml").write_text(WORKERS)
    orch = processes.start(["orchestrator", "-c", str(tmp_path / "run.toml"), "--new_swarm",
                            "--identity_path", str(tmp_path / "owner.pem"), "--checkpoint_dir", str(tmp_path / "ckpt"),
                            *on(lab, "relay")], log_path=tmp_path / "orch.log", wrapper=lab.wrapper("relay"))
    ready = orch.wait_ready()
    ids = {}
    # the NATed worker first: training waits for min_workers = 2, so by the time the public one
    # joins and the run starts, the NATed one has found itself private (the run takes a second)
    for host in ("nat0", "public"):
        ids[host] = Identity.create(tmp_path / f"{host}.pem").peer_id
        worker = processes.start(["peer", "--run", ready["run_id"], "--initial_peers", *ready["maddrs"],
                                  "--roles", "block-worker", "--identity_path", str(tmp_path / f"{host}.pem"),
                                  "--checkpoint_dir", str(tmp_path / "ckpt"), *on(lab, host)],
                                 log_path=tmp_path / f"{host}.log", wrapper=lab.wrapper(host))
        if host == "nat0":
            nated = worker.wait_event(lambda e: e["event"] == "reachability" and e["reachability"] != "unknown",
                                      also=[orch])
            assert nated["reachability"] == "private", nated
    versions, assignment = [], {}
    while (event := orch.wait_event(lambda e: e["event"] in ("blocktrain.assignment", "blocktrain.version",
                                                             "blocktrain.finished"), also=processes.started))["event"] \
            != "blocktrain.finished":
        if event["event"] == "blocktrain.assignment":
            assignment = event["assignment"]
        else:
            versions.append((event, dict(assignment)))
    mine = [e for e, assigned in versions if assigned.get(ids["nat0"]) == e["block"]]
    assert mine and all(ids["nat0"] in e["used"] for e in mine), versions
    assert event["versions"] == [3, 3], event
