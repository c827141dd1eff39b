"""The TL++ roles together over loopback TCP and encrypted links (``harness``): base mode is
centralized training, secure mode is base mode to fixed-point precision, a node failing in either
phase is dropped and renormalised out, a dead helper stops secure training with a clear error, each
party accepts only its own share, and a node whose push to the helper failed does not count."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gossamer.crypto.identity import Identity
from gossamer.peer.kit.secure_link import LinkMessage, RequestRefused, SecureLinkError, SecureLinks
from gossamer.protocols.tlpp.core import VirtualBatch, VirtualBatchScheduler, digits_cnn
from gossamer.protocols.tlpp.data import load_data
from gossamer.protocols.tlpp.ledger import StepLedger
from gossamer.protocols.tlpp.wire import HELPER_METHOD, NODE_METHOD, PING, SHARE, ShareLog
from gossamer.transport.errors import RemoteError
from gossamer.transport.tcp import tcp_connect
from tests.protocols.tlpp.harness import Tlpp, drive

SOURCES = [f"builtin:digits:shard={i}/3" for i in range(3)]
ALL = {"node0", "node1", "node2"}
HYPER = {"batch_size": 24, "optimizer": "sgd", "lr": 0.2, "steps": 4, "eval_every": 0, "min_nodes": 3,
         "node_timeout_s": 10.0, "helper_timeout_s": 5.0, "helper_wait_s": 2.0}
# secure mode refuses SGD (the helper would read the gradient off the weights) and sums at least
# min_batch = 2 x 10 samples: a batch of 48 still has ~32 after one of the three nodes drops out
SECURE = {**HYPER, "mode": "secure", "optimizer": "adam", "lr": 0.01, "batch_size": 48}


def identities() -> dict[str, Identity]:
    return {name: Identity.generate() for name in ["node0", "node1", "node2", "helper", "orchestrator"]}


async def train(net: Tlpp, timeout_s: float = 60.0) -> None:
    await net.orchestrator.start()
    await asyncio.wait_for(net.orchestrator.done.wait(), timeout_s)


def centralized(net: Tlpp, plan: list[tuple[int, set[str]]], *, lr: float,
                batch_size: int = HYPER["batch_size"]) -> dict[str, torch.Tensor]:
    """Plain SGD on one model over the virtual batches the orchestrator draws: ``plan`` lists, per
    step, the batch index and the nodes whose samples count; a node is out of the schedule from
    the step after its first absence (the orchestrator's rule after a failure)."""
    names = {net.id_of(f"node{i}"): f"node{i}" for i in range(len(SOURCES))}
    data = {n: load_data(SOURCES[int(name[4:])], input_shape=(1, 8, 8), num_classes=10) for n, name in names.items()}
    scheduler = VirtualBatchScheduler({n: len(d) for n, d in data.items()}, batch_size=batch_size, seed=0)
    model = digits_cnn(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for index, kept in plan:
        batch = scheduler.epoch(0)[index]
        picked = {n: i for n, i in batch.by_node().items() if names[n] in kept}
        x = torch.cat([data[n].x[i] for n, i in picked.items()])
        y = torch.cat([data[n].y[i] for n, i in picked.items()])
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        gone = [n for n in scheduler.counts if names[n] not in kept]
        if gone:
            scheduler = scheduler.without(gone)
    return dict(model.named_parameters())


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].detach() - b[k].detach()).abs().max()) for k in a)


async def test_base_mode_is_centralized_training_and_secure_mode_computes_its_gradients(tmp_path: Path) -> None:
    """Base mode trains exactly as centralized SGD on the same virtual batches. Secure mode's
    driver computes the same gradients to fixed-point precision, also when node1 fails its
    backward at step 1 (the sum over the nodes that completed, normalised as documented); and the
    secure orchestrator (Adam) trains to the end on every node."""
    ids = identities()
    base = await Tlpp.create(tmp_path / "base", hyper={**HYPER, "mode": "base"}, sources=SOURCES, helper=False,
                             identities=ids)
    secure = await Tlpp.create(tmp_path / "secure", hyper=SECURE, sources=SOURCES, helper=True, identities=ids)
    trained = await Tlpp.create(tmp_path / "trained", hyper=SECURE, sources=SOURCES, helper=True)
    try:
        await train(base)
        reference = centralized(base, [(i, ALL) for i in range(HYPER["steps"])], lr=HYPER["lr"])
        assert max_difference(dict(base.orchestrator.model.named_parameters()), reference) < 1e-5
        assert base.orchestrator.finished and not base.orchestrator.error
        assert all(ledger.applied and len(ledger.used) == 3 for ledger in base.orchestrator.history)

        plan = [(0, ALL), (1, {"node0", "node2"}), (2, {"node0", "node2"}), (3, {"node0", "node2"})]
        secure.fail("node1", 1, "backward")
        ledgers = await drive(secure, plan, lr=HYPER["lr"])
        assert "injected fault" in ledgers[1].rejected[secure.id_of("node1")]
        reference = centralized(secure, plan, lr=HYPER["lr"], batch_size=SECURE["batch_size"])
        assert max_difference(dict(secure.orchestrator.model.named_parameters()), reference) < 1e-3

        await train(trained)
        assert trained.orchestrator.finished and not trained.orchestrator.error
        assert all(ledger.applied and len(ledger.used) == 3 for ledger in trained.orchestrator.history)
    finally:
        for net in (base, secure, trained):
            await net.aclose()


def share_logs(net: Tlpp, tmp_path: Path) -> tuple[Path, Path]:
    orchestrator_log, helper_log = tmp_path / "orchestrator.jsonl", tmp_path / "helper.jsonl"
    net.orchestrator.driver.share_log = ShareLog(orchestrator_log)
    net.peers["helper"].role.share_log = ShareLog(helper_log)  # type: ignore[attr-defined]
    return orchestrator_log, helper_log


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_node_failing_mid_batch_is_dropped_and_the_gradient_is_that_of_the_completed_samples(
        tmp_path: Path) -> None:
    """Base mode: node1 fails its backward of step 1 (after the loss was taken over its samples):
    the step applies the gradient of the mean loss over node0's and node2's samples, the ledger
    says so, node1 leaves the schedule, training goes on and matches centralized SGD on exactly
    the samples that counted."""
    net = await Tlpp.create(tmp_path, hyper={**HYPER, "mode": "base"}, sources=SOURCES, helper=False)
    net.fail("node1", 1, "backward")
    try:
        await train(net)
        ledgers = list(net.orchestrator.history)
        assert [ledger.applied for ledger in ledgers] == [True] * 4 and net.orchestrator.finished
        assert list(ledgers[1].rejected) == [net.id_of("node1")] and "backward: " in ledgers[1].rejected[net.id_of("node1")]
        assert "injected fault" in ledgers[1].rejected[net.id_of("node1")]
        assert ledgers[1].used == sorted([net.id_of("node0"), net.id_of("node2")])
        assert ledgers[1].samples == ledgers[1].planned[net.id_of("node0")] + ledgers[1].planned[net.id_of("node2")]
        assert all(net.id_of("node1") not in ledger.planned for ledger in ledgers[2:])
        reference = centralized(net, [(0, ALL), (1, {"node0", "node2"}), (2, {"node0", "node2"}),
                                      (3, {"node0", "node2"})], lr=HYPER["lr"])
        assert max_difference(dict(net.orchestrator.model.named_parameters()), reference) < 1e-5
    finally:
        await net.aclose()


async def test_secure_mode_survives_nodes_failing_in_either_phase_and_no_party_holds_both_shares(
        tmp_path: Path) -> None:
    """node1 fails its backward at step 1: the step applies the sum over node0 and node2 and node1
    leaves the schedule. node2 fails its forward at step 2: one node is left, fewer than k = 2, so
    nothing is revealed or applied (the ledger says why) and the schedule is rebuilt from the live
    nodes, all three of which train step 3."""
    net = await Tlpp.create(tmp_path, hyper=SECURE, sources=SOURCES, helper=True)
    orchestrator_log, helper_log = share_logs(net, tmp_path)
    net.fail("node1", 1, "backward")
    net.fail("node2", 2, "forward")
    try:
        await train(net)
        ledgers = list(net.orchestrator.history)
        assert [ledger.applied for ledger in ledgers] == [True, True, False, True] and not net.orchestrator.error
        assert list(ledgers[1].rejected) == [net.id_of("node1")] and ledgers[1].rejected[net.id_of("node1")].startswith(
            "backward: ")
        assert ledgers[1].used == sorted([net.id_of("node0"), net.id_of("node2")])
        note = "not run: of the nodes that answered the forward pass, 1 node(s), fewer than min_sum_nodes = 2"
        # node2 failed; node0 answered but the step was given up: rejected with the step's reason, so
        # the ledger balances, and (not its fault) still scheduled at step 3
        assert ledgers[2].rejected == {net.id_of("node2"): ledgers[2].rejected[net.id_of("node2")],
                                       net.id_of("node0"): f"step: {note}"}
        assert ledgers[2].rejected[net.id_of("node2")].startswith("forward: ") and ledgers[2].note == note
        assert all(ledger.balance_problems() == [] for ledger in ledgers), [ledger.to_json() for ledger in ledgers]
        assert ledgers[3].used == sorted(net.id_of(name) for name in ALL)
    finally:
        await net.aclose()
    at_orchestrator, at_helper = read_log(orchestrator_log), read_log(helper_log)
    assert {e["share_index"] for e in at_orchestrator} == {0} and {e["share_index"] for e in at_helper} == {1}
    held = {(e["step"], e["node"], e["tensor"]) for e in at_orchestrator}
    assert {(e["step"], e["node"], e["tensor"]) for e in at_helper} >= held  # the helper got share 1 of each
    assert (1, net.id_of("node1"), "act") in held and not any(k[:2] == (1, net.id_of("node1")) and k[2] != "act"
                                                              for k in held)


@pytest.mark.parametrize("how", ["killed before the run", "fails its logits request"])
async def test_a_dead_helper_stops_secure_training_with_a_clear_error(tmp_path: Path, how: str) -> None:
    net = await Tlpp.create(tmp_path, hyper={**SECURE, "steps": 50}, sources=SOURCES, helper=True)
    if how == "killed before the run":
        await net.kill("helper")
    else:
        net.fail("helper", 1, "logits")
    try:
        await train(net)
        role = net.orchestrator
        assert "helper" in role.error and "secure training cannot go on" in role.error and not role.finished
        assert role.step == (0 if how == "killed before the run" else 1)
        checkpoint = role.checkpoint_path
    finally:
        await net.aclose()
    assert await asyncio.to_thread(Path(checkpoint).is_file)


async def test_each_party_takes_only_its_own_share_and_only_the_orchestrator_drives_nodes(tmp_path: Path) -> None:
    net = await Tlpp.create(tmp_path, hyper=SECURE, sources=SOURCES, helper=True)
    as_node = SecureLinks(identity=net.identities["node0"], run_id=net.manifest.run_id, view=net.view)
    as_owner = SecureLinks(identity=net.owner, run_id=net.manifest.run_id, view=net.view)
    as_helper = SecureLinks(identity=net.identities["helper"], run_id=net.manifest.run_id, view=net.view)
    share = {"act": torch.zeros(2, 64, dtype=torch.int64)}
    try:
        with pytest.raises(RequestRefused, match="party 0") as refused:
            await as_node.request(net.id_of("helper"), HELPER_METHOD,
                                  LinkMessage(SHARE, 0, {"kind": "act", "party": 0}, share), timeout_s=5.0)
        assert refused.value.code == "party"
        with pytest.raises(RequestRefused, match="does not take 'share'"):
            await as_owner.request(net.id_of("helper"), HELPER_METHOD,
                                   LinkMessage(SHARE, 0, {"kind": "act", "party": 1}, share), timeout_s=5.0)
        with pytest.raises(SecureLinkError, match="not this run's orchestrator"):
            await as_helper.request(net.id_of("node0"), NODE_METHOD, LinkMessage("forward", 0), timeout_s=5.0)
        assert net.peers["helper"].role.shares_received == 0  # type: ignore[attr-defined]
    finally:
        for links in (as_node, as_owner, as_helper):
            await links.aclose()
        await net.aclose()


async def test_a_node_that_lost_its_weights_gets_them_again(tmp_path: Path) -> None:
    net = await Tlpp.create(tmp_path, hyper={**HYPER, "mode": "base"}, sources=SOURCES[:1], helper=False)
    driver, node = net.orchestrator.driver, net.peers["node0"].role
    batch = VirtualBatch(epoch=0, index=0, order=tuple((net.id_of("node0"), i) for i in range(5)))
    try:
        first = StepLedger(step=0, epoch=0, index=0, mode="base")
        assert await driver.run(batch, first, None) is not None and node.version == 0  # type: ignore[attr-defined]
        node.version = -1  # type: ignore[attr-defined]  # as after a restart
        again = StepLedger(step=1, epoch=0, index=0, mode="base")
        assert await driver.run(batch, again, None) is not None
        assert again.used == [net.id_of("node0")] and not again.rejected and node.version == 0  # type: ignore[attr-defined]
    finally:
        await net.aclose()


async def test_a_replayed_share_frame_is_refused_by_the_helper(tmp_path: Path) -> None:
    """A node's real share frame, captured on the wire and sent again from another connection, is
    refused (its session belongs to the node's connection); the helper takes nothing from it.
    (Tampered and replayed frames on the session's own connection: test_secure_link.)"""
    net = await Tlpp.create(tmp_path, hyper={**SECURE, "steps": 1}, sources=SOURCES, helper=True)
    try:
        await train(net)
        helper = net.peers["helper"].role
        taken = helper.shares_received  # type: ignore[attr-defined]
        frame = [f for f in net.received["helper"] if f.header.get("op") == SHARE][-1]
        conn = await tcp_connect(*net.peers["helper"].tcp.address)  # type: ignore[union-attr]
        try:
            with pytest.raises(RemoteError, match="belongs to another connection"):
                await conn.request(frame)
        finally:
            await conn.aclose()
        assert helper.shares_received == taken  # type: ignore[attr-defined]
    finally:
        await net.aclose()



async def test_a_node_whose_push_failed_is_not_counted_and_the_next_step_trains(tmp_path: Path) -> None:
    """Nodes push share 1 beside their answer: when the helper refuses every push of step 0, the
    nodes still answer the orchestrator, but the helper's logits answer names none of them, so no
    node counts as contributing and nothing is applied; the failed pushes are counted on the nodes."""
    net = await Tlpp.create(tmp_path, hyper={**SECURE, "helper_wait_s": 0.5}, sources=SOURCES,
                            helper=True)
    driver, helper = net.orchestrator.driver, net.id_of("helper")
    nodes = sorted(net.id_of(name) for name in ALL)
    batch = VirtualBatch(epoch=0, index=0, order=tuple((n, i) for n in nodes for i in range(8)))
    net.fail("helper", 0, SHARE)
    try:
        refused = StepLedger(step=0, epoch=0, index=0, mode="secure")
        assert await driver.run(batch, refused, helper) is None
        assert refused.rejected == {n: "logits: the helper holds no matching activation share" for n in nodes}
        for name in sorted(ALL):
            role = net.peers[name].role
            await role.drain()
            assert role.pushes_failed == 1  # type: ignore[attr-defined]
        applied = StepLedger(step=1, epoch=0, index=0, mode="secure")
        grads = await driver.run(batch, applied, helper)
        assert grads is not None and applied.used == nodes and not applied.rejected and applied.samples == 24
    finally:
        await net.aclose()


async def test_a_node_the_helper_does_not_see_is_left_out_before_its_forward_and_the_others_train(
        tmp_path: Path) -> None:
    """Secure mode: before a node's first step with a helper the orchestrator asks the helper
    whether it sees the node live (``ping``). A node it does not see could not push it a share:
    it is dropped before its forward (phase "helper"), never half-used, and the others train."""
    net = await Tlpp.create(tmp_path, hyper={**SECURE, "helper_wait_s": 0.5}, sources=SOURCES,
                            helper=True)
    driver, helper = net.orchestrator.driver, net.id_of("helper")
    nodes = sorted(net.id_of(name) for name in ALL)
    unseen = net.id_of("node0")
    batch = VirtualBatch(epoch=0, index=0, order=tuple((n, i) for n in nodes for i in range(12)))
    net.forget("node0")
    try:
        ledger = StepLedger(step=0, epoch=0, index=0, mode="secure")
        assert await driver.run(batch, ledger, helper) is not None
        assert ledger.rejected == {unseen: "helper: the helper does not see this node as a live data node of the run"}
        assert ledger.used == sorted(set(nodes) - {unseen}) and ledger.samples == 24
        assert net.peers["node0"].role.last_step == -1  # type: ignore[attr-defined]  # never asked to forward
    finally:
        await net.aclose()


async def test_the_helper_waits_for_a_node_it_does_not_see_yet(tmp_path: Path) -> None:
    """The helper's ``ping`` answers a node that becomes live while it waits (``helper_wait_s``)."""
    net = await Tlpp.create(tmp_path, hyper={**SECURE, "helper_wait_s": 4.0}, sources=SOURCES,
                            helper=True)
    as_owner = SecureLinks(identity=net.owner, run_id=net.manifest.run_id, view=net.view)
    helper = net.peers["helper"].role
    asked = sorted([net.id_of("node0"), net.id_of("node1")])
    net.forget("node0")
    try:
        ping = asyncio.create_task(as_owner.request(net.id_of("helper"), HELPER_METHOD,
                                                    LinkMessage(PING, 7, {"nodes": asked}), timeout_s=10.0))
        while helper.last_step != 7:  # type: ignore[attr-defined]  # noqa: ASYNC110 (no event: the helper has the ping once its last_step says so)
            await asyncio.sleep(0.01)
        net.peers["node0"].alive = True
        await net.publish()
        assert (await ping).fields["nodes"] == asked
        net.forget("node1")
        alone = await as_owner.request(net.id_of("helper"), HELPER_METHOD,
                                       LinkMessage(PING, 8, {"nodes": asked}), timeout_s=10.0)
        assert alone.fields["nodes"] == [net.id_of("node0")]
    finally:
        await as_owner.aclose()
        await net.aclose()


async def test_a_resumed_orchestrator_replaying_steps_a_secure_node_answered_keeps_the_node(tmp_path: Path) -> None:
    """A secure node answers one forward per step, steps going up. An orchestrator resumed from a
    checkpoint older than the node's last step replays steps it answered: the node refuses them,
    those steps train on the others, and the node stays scheduled and trains from the next step on."""
    net = await Tlpp.create(tmp_path, hyper={**SECURE, "steps": 6}, sources=SOURCES, helper=True)
    net.peers["node2"].role.forwarded_step = 2  # type: ignore[attr-defined]  # as before the orchestrator's restart
    try:
        await train(net)
        ledgers, node2 = list(net.orchestrator.history), net.id_of("node2")
        assert all(ledger.applied for ledger in ledgers) and not net.orchestrator.error
        assert all("answers one forward per step" in ledger.rejected[node2] for ledger in ledgers[:3])
        assert all(node2 in ledger.used for ledger in ledgers[3:])
    finally:
        await net.aclose()


async def test_the_per_step_figures_are_the_owners_only(tmp_path: Path) -> None:
    """The orchestrator's per-step loss, accuracy and batch makeup, and a node's data path, are in
    its owner's status only: anyone else reading /status or /metrics gets them withheld."""
    net = await Tlpp.create(tmp_path, hyper={**HYPER, "mode": "base", "steps": 2}, sources=SOURCES, helper=False)
    try:
        await train(net)
        role, node = net.orchestrator, net.peers["node0"].role
        assert role.status()["ledgers"] and role.gauges()["tlpp_train_loss"] > 0
        public, gauges = role.public_status(), role.public_gauges()
        assert not {"ledgers", "series", "evaluation"} & set(public) and public["step"] == 2
        assert set(gauges) == {"tlpp_step"}
        assert "data" in node.status() and "data" not in node.public_status()
    finally:
        await net.aclose()
